// SPDX-License-Identifier: MIT

package tunnel

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// TestReusePortBind opens 4 sockets per family on one port, sends a
// datagram from each of 64 client sockets and answers each through the
// bind: every datagram arrives once, more than one socket receives, every
// client gets its answer, and Close ends every receive function.
func TestReusePortBind(t *testing.T) {
	const n, clients = 4, 64
	b, err := NewReusePortBind(n)
	if err != nil {
		t.Fatal(err)
	}
	fns, port, err := b.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) < n || len(fns)%n != 0 {
		t.Fatalf("receive functions: got %d, want %d per address family", len(fns), n)
	}
	type rx struct {
		fn      int
		payload string
		ep      conn.Endpoint
	}
	got := make(chan rx, 2*clients)
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := make([][]byte, b.BatchSize())
			for j := range bufs {
				bufs[j] = make([]byte, 2048)
			}
			sizes, eps := make([]int, len(bufs)), make([]conn.Endpoint, len(bufs))
			for {
				k, err := fn(bufs, sizes, eps)
				if err != nil {
					if !errors.Is(err, net.ErrClosed) {
						t.Errorf("receive function %d: %v, want net.ErrClosed", i, err)
					}
					return
				}
				for j := 0; j < k; j++ {
					got <- rx{i, string(bufs[j][:sizes[j]]), eps[j]}
				}
			}
		}()
	}
	cs := make([]*net.UDPConn, clients)
	for i := range cs {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(port)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
		if _, err := c.Write([]byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	perFn := map[int]int{}
	for len(seen) < clients {
		select {
		case r := <-got:
			seen[r.payload]++
			perFn[r.fn]++
			if err := b.Send([][]byte{[]byte("re:" + r.payload)}, r.ep); err != nil {
				t.Fatalf("send to %s: %v", r.ep.DstToString(), err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("received from %d of %d clients", len(seen), clients)
		}
	}
	if len(perFn) < 2 {
		t.Errorf("datagrams of %d clients all arrived on one socket (%v), want them spread", clients, perFn)
	}
	buf := make([]byte, 64)
	for i, c := range cs {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := c.Read(buf)
		if err != nil || string(buf[:k]) != "re:"+strconv.Itoa(i) {
			t.Errorf("client %d: answer %q, %v", i, buf[:k], err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for p, c := range seen {
		if c != 1 {
			t.Errorf("datagram %s arrived %d times", p, c)
		}
	}
}

// TestReusePortOtherUser: another user cannot join the gateway's
// SO_REUSEPORT group to take a share of the jobs' datagrams.
func TestReusePortOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a command as another user")
	}
	py := "/usr/bin/python3" // the distribution's, which another user may run
	if _, err := os.Stat(py); err != nil {
		t.Skip("python3 not installed")
	}
	b, err := NewReusePortBind(2)
	if err != nil {
		t.Fatal(err)
	}
	_, port, err := b.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	script := fmt.Sprintf(`import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("0.0.0.0", %d))
print("bound")`, port)
	cmd := exec.Command(py, "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("Address already in use")) {
		t.Fatalf("another user's SO_REUSEPORT bind of port %d: %v\n%s\nwant EADDRINUSE", port, err, out)
	}
	// The gateway's own user can (what SO_REUSEPORT is for).
	if out, err := exec.Command(py, "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("same user's SO_REUSEPORT bind of port %d: %v\n%s", port, err, out)
	}
}

// TestGatewayReusePortJobs runs a gateway device on 4 UDP sockets with 8
// clients at once: every client's packets reach the gateway's TUN and the
// gateway's reach every client.
func TestGatewayReusePortJobs(t *testing.T) {
	const jobs = 8
	log := slog.New(slog.DiscardHandler)
	gwPriv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	udp, err := NewReusePortBind(4)
	if err != nil {
		t.Fatal(err)
	}
	gwTun := tuntest.NewChannelTUN()
	gw, err := NewGateway(log, gwTun.TUN(), 1, NewBind(udp, log), gwPriv, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	ep := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), gw.Port())
	tuns := make([]*tuntest.ChannelTUN, jobs)
	addrs := make([]netip.Addr, jobs)
	for i := range tuns {
		priv, err := wgkey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = netip.AddrFrom4([4]byte{10, 0, 1, byte(10 + i)})
		if err := gw.AddPeer(priv.PublicKey(), addrs[i]); err != nil {
			t.Fatal(err)
		}
		tuns[i] = tuntest.NewChannelTUN()
		cl, err := NewClient(log, tuns[i].TUN(), NewBind(nil, log), priv, gwPriv.PublicKey(), ep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
	}
	for i := range tuns {
		tuns[i].Outbound <- tuntest.Ping(gwTunAddr, addrs[i])
	}
	from := map[netip.Addr]bool{}
	for len(from) < jobs {
		select {
		case p := <-gwTun.Inbound:
			from[netip.AddrFrom4([4]byte(p[12:16]))] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("gateway got packets from %d of %d jobs", len(from), jobs)
		}
	}
	for i := range tuns {
		gwTun.Outbound <- tuntest.Ping(addrs[i], gwTunAddr)
	}
	for i := range tuns {
		select {
		case p := <-tuns[i].Inbound:
			if !bytes.Equal(p, tuntest.Ping(addrs[i], gwTunAddr)) {
				t.Errorf("job %d: packet changed", i)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("job %d: no packet from the gateway", i)
		}
	}
}

func TestNewReusePortBindBounds(t *testing.T) {
	for _, n := range []int{0, -1, MaxUDPSockets + 1} {
		if _, err := NewReusePortBind(n); err == nil {
			t.Errorf("NewReusePortBind(%d): no error", n)
		}
	}
}
