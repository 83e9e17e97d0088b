// SPDX-License-Identifier: MIT

package netstack

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/test/topology"
)

// freePort returns a port that is free on 127.0.0.1 for network.
func freePort(t *testing.T, network string) uint16 {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return uint16(c.LocalAddr().(*net.UDPAddr).Port)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func TestExpose(t *testing.T) {
	checkGoroutines(t)
	log := &recLog{}
	tb := flows.New(flows.Config{Log: log})
	p := newPair(t, Config{Egress: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Flows: tb})
	if err := p.s.AddJob(testJob("L", jobAddr)); err != nil {
		t.Fatal(err)
	}

	// The job serves TCP 8080 (greeting, then echo until EOF) and UDP 5353
	// (echo, prefixed).
	ln, err := gonet.ListenTCP(p.job, fullAddr(netip.AddrPortFrom(jobAddr, 8080)), ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, "hello from job "+c.RemoteAddr().String()+"\n")
				io.Copy(c, c)
			}()
		}
	}()
	la := fullAddr(netip.AddrPortFrom(jobAddr, 5353))
	uc, err := gonet.DialUDP(p.job, &la, nil, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			uc.WriteTo(append([]byte("job:"), buf[:n]...), from)
		}
	}()

	tcpPub, udpPub, closedPub := freePort(t, "tcp"), freePort(t, "udp"), freePort(t, "tcp")
	ex := []forward.Exposure{
		{Proto: ipproto.TCP, JobPort: 8080, PublicPort: tcpPub, PublicAddr: netip.IPv4Unspecified()},
		{Proto: ipproto.UDP, JobPort: 5353, PublicPort: udpPub, PublicAddr: netip.IPv4Unspecified()},
		{Proto: ipproto.TCP, JobPort: 9999, PublicPort: closedPub, PublicAddr: netip.IPv4Unspecified()}, // nothing listens in the job
	}
	if err := p.s.expose("L", ex); err != nil {
		t.Fatalf("Expose: %v", err)
	}

	// TCP: greeting from the job, seen from the gateway's tunnel address;
	// echo; half-close.
	c, err := net.DialTimeout("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), tcpPub).String(), 2*time.Second)
	if err != nil {
		t.Fatalf("dial exposed tcp: %v", err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "hello from job "+gwPrefix.Addr().String()+":") {
		t.Errorf("greeting: got %q, %v; want hello from job %s:PORT", line, err, gwPrefix.Addr())
	}
	io.WriteString(c, "ping")
	c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(r); err != nil || string(rest) != "ping" {
		t.Errorf("echo after half-close: got %q, %v; want ping", rest, err)
	}
	c.Close()
	// The inbound flow is recorded from the job's side: it sent the
	// greeting and the echo, and received "ping".
	if recs := log.wait(t, 1); recs[0].Direction != flows.Inbound || recs[0].Proto != "tcp" ||
		recs[0].Dst != netip.AddrPortFrom(jobAddr, 8080).String() || recs[0].Src != c.LocalAddr().String() ||
		recs[0].BytesOut != uint64(len(line)+4) || recs[0].BytesIn != 4 {
		t.Errorf("inbound tcp flow record %+v, want %s → %s:8080, %d bytes out, 4 in", recs[0], c.LocalAddr(), jobAddr, len(line)+4)
	}

	// UDP: two peers, each gets its own replies.
	for i := range 2 {
		u, err := net.Dial("udp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), udpPub).String())
		if err != nil {
			t.Fatal(err)
		}
		msg := strings.Repeat("x", i+1)
		u.Write([]byte(msg))
		u.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 100)
		n, err := u.Read(buf)
		if err != nil || string(buf[:n]) != "job:"+msg {
			t.Errorf("udp peer %d: got %q, %v; want %q", i, buf[:n], err, "job:"+msg)
		}
		// The reply is counted right after it is sent: allow for the race.
		var act []flows.Record
		topology.Poll(2*time.Second, func() bool {
			act = tb.Active(flows.Filter{})
			return len(act) == 1 && act[0].BytesOut == uint64(i+5)
		})
		if len(act) != 1 || act[0].Proto != "udp" || act[0].Direction != flows.Inbound || act[0].Src != u.LocalAddr().String() ||
			act[0].BytesIn != uint64(i+1) || act[0].BytesOut != uint64(i+5) || act[0].PacketsIn != 1 || act[0].PacketsOut != 1 {
			t.Errorf("udp peer %d: active flows %+v, want its inbound flow with %d bytes in, %d out", i, act, i+1, i+5)
		}
		u.Close()
		tb.EndAll(flows.EndClosed) // the next peer's flow is then the only active one
	}

	// A port the job does not listen on: the client sees the connection
	// end (reset), not a hang.
	start := time.Now()
	c, err = net.DialTimeout("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), closedPub).String(), 2*time.Second)
	if err == nil {
		c.SetDeadline(time.Now().Add(8 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if err == nil || time.Since(start) > 3*time.Second {
			t.Errorf("exposed port without a listener in the job: read %v after %v, want a quick error", err, time.Since(start))
		}
	}

	// Exposing twice replaces; a busy public port fails and leaves nothing.
	if err := p.s.expose("L", ex[:1]); err != nil {
		t.Fatalf("Expose again: %v", err)
	}
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bad := []forward.Exposure{{Proto: ipproto.TCP, JobPort: 1, PublicPort: freePort(t, "tcp"), PublicAddr: netip.IPv4Unspecified()},
		{Proto: ipproto.TCP, JobPort: 2, PublicPort: uint16(busy.Addr().(*net.TCPAddr).Port), PublicAddr: netip.IPv4Unspecified()}}
	if err := p.s.expose("L", bad); err == nil {
		t.Error("Expose on a busy port: got no error")
	}
	if c, err := net.DialTimeout("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), bad[0].PublicPort).String(), time.Second); err == nil {
		c.Close()
		t.Error("after a failed Expose the first listener is still open")
	}

	p.s.expose("L", ex[:1])
	p.s.unexpose("L")
	if c, err := net.DialTimeout("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), tcpPub).String(), time.Second); err == nil {
		c.Close()
		t.Error("after Unexpose the public port still accepts")
	}
	// Stack.Close closes listeners left exposed.
	if err := p.s.expose("L", ex[:2]); err != nil {
		t.Fatal(err)
	}
	p.s.Close()
	if c, err := net.DialTimeout("tcp", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), tcpPub).String(), time.Second); err == nil {
		c.Close()
		t.Error("after Close the public port still accepts")
	}
	if err := p.s.expose("L", ex[:1]); err == nil {
		t.Error("Expose after Close: got no error")
	}
}

// TestExposeNeedsEgressAddr: without an egress address there is nowhere
// announced to listen, and Expose refuses rather than listening on every
// address of the host (loopback and management addresses included).
func TestExposeNeedsEgressAddr(t *testing.T) {
	checkGoroutines(t)
	p := newPair(t, Config{})
	if err := p.s.AddJob(testJob("L", jobAddr)); err != nil {
		t.Fatal(err)
	}
	port := freePort(t, "tcp")
	err := p.s.expose("L", []forward.Exposure{{Proto: ipproto.TCP, JobPort: 8080, PublicPort: port, PublicAddr: netip.IPv4Unspecified()}})
	if err == nil || !strings.Contains(err.Error(), "egress address") {
		t.Fatalf("Expose without an egress address: got %v, want an error naming the egress address", err)
	}
	if c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String(), time.Second); err == nil {
		c.Close()
		t.Errorf("something listens on 127.0.0.1:%d after a refused Expose", port)
	}
}
