// SPDX-License-Identifier: MIT

package netstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

var _ forward.Backend = (*Stack)(nil)

// TestTCPBulkBothWays: 8 MiB each way over each TCP stack and address
// family; the kernel stack terminates both families.
func TestTCPBulkBothWays(t *testing.T) {
	for _, name := range tcpStacks {
		for _, f := range ipfamily.All {
			t.Run(name+"/"+f.Name, func(t *testing.T) { testTCPBulkBothWays(t, name, f) })
		}
	}
}

func testTCPBulkBothWays(t *testing.T, stackName string, f *ipfamily.Family) {
	checkGoroutines(t)
	const size = 8 << 20
	serverSent := make([]byte, size)
	rand.Read(serverSent)
	serverGot := make(chan [32]byte, 1)
	srv := listenTCP(t, func(c net.Conn) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Write(serverSent)
			c.(*net.TCPConn).CloseWrite()
		}()
		h := sha256.New()
		io.Copy(h, c)
		<-done
		var sum [32]byte
		copy(sum[:], h.Sum(nil))
		serverGot <- sum
	})
	cfg := tcpStackConfig(t, stackName)
	cfg.Addrs = []netip.Prefix{gwPrefix, gwPrefix6}
	p := newPair(t, cfg)
	dst, dial := "198.51.100.7:80", p.jobDialTCP
	if f == ipfamily.V6 {
		p.addJobIPv6(t)
		dst, dial = "[2001:db8::7]:80", p.jobDialTCP6
	}
	p.dial.route(dst, srv)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := dial(ctx, dst)
	if err != nil {
		t.Fatalf("job dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))

	clientSent := make([]byte, size)
	rand.Read(clientSent)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(clientSent)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	h := sha256.New()
	n, err := io.Copy(h, c)
	if err != nil {
		t.Fatalf("job read: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("job write: %v", err)
	}
	if n != size {
		t.Fatalf("job received %d bytes, want %d", n, size)
	}
	if got, want := h.Sum(nil), sha256.Sum256(serverSent); !bytes.Equal(got, want[:]) {
		t.Errorf("server→job sha256: got %x, want %x", got, want)
	}
	select {
	case got := <-serverGot:
		if want := sha256.Sum256(clientSent); got != want {
			t.Errorf("job→server sha256: got %x, want %x", got, want)
		}
	case <-ctx.Done():
		t.Fatal("server did not finish")
	}
	wantKernel := uint64(0)
	if stackName == "kernel" {
		wantKernel = 1
	}
	if st := p.s.Counters(); st.TCPFlows != 1 || st.KernelTCPFlows != wantKernel {
		t.Errorf("TCPFlows, KernelTCPFlows: got %d, %d, want 1, %d", st.TCPFlows, st.KernelTCPFlows, wantKernel)
	}
}

func TestTCPHalfClose(t *testing.T) {
	for _, name := range tcpStacks {
		t.Run(name, func(t *testing.T) { testTCPHalfClose(t, name) })
	}
}

func testTCPHalfClose(t *testing.T, stackName string) {
	checkGoroutines(t)
	srv := listenTCP(t, func(c net.Conn) {
		b, err := io.ReadAll(c) // until the job's CloseWrite
		if err != nil {
			return
		}
		c.Write(append([]byte("echo:"), b...))
	})
	p := newPair(t, tcpStackConfig(t, stackName))
	p.dial.route("198.51.100.7:7", srv)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.jobDialTCP(ctx, "198.51.100.7:7")
	if err != nil {
		t.Fatalf("job dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("job read: %v", err)
	}
	if want := "echo:hello"; string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestTCPRefused(t *testing.T) {
	for _, name := range tcpStacks {
		t.Run(name, func(t *testing.T) { testTCPRefused(t, name) })
	}
}

func testTCPRefused(t *testing.T, stackName string) {
	checkGoroutines(t)
	p := newPair(t, tcpStackConfig(t, stackName))
	p.dial.route("198.51.100.7:81", closedPort(t, "tcp"))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := p.jobDialTCP(ctx, "198.51.100.7:81")
	if err == nil {
		c.Close()
		t.Fatal("job dial succeeded, want refused")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refusal took %v, want < 2s", d)
	}
	if !isRefused(err) {
		t.Errorf("job dial error: got %v, want connection refused", err)
	}
	if st := p.s.Counters(); st.DialFailures != 1 || st.TCPFlows != 0 {
		t.Errorf("stats: got %+v, want 1 dial failure and no flows", st)
	}
}

func TestTCPToTunnelAddressRefused(t *testing.T) {
	for _, name := range tcpStacks {
		t.Run(name, func(t *testing.T) { testTCPToTunnelAddressRefused(t, name) })
	}
}

func testTCPToTunnelAddressRefused(t *testing.T, stackName string) {
	checkGoroutines(t)
	p := newPair(t, tcpStackConfig(t, stackName))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := p.jobDialTCP(ctx, "100.64.0.1:22")
	if err == nil {
		c.Close()
		t.Fatal("job dial to the tunnel address succeeded, want refused")
	}
	if !isRefused(err) || time.Since(start) > 2*time.Second {
		t.Errorf("job dial: got %v after %v, want prompt connection refused", err, time.Since(start))
	}
	if calls := p.dial.Calls(); len(calls) != 0 {
		t.Errorf("dial hook called: %q", calls)
	}
	if st := p.s.Counters(); st.Denied != 1 {
		t.Errorf("Denied: got %d, want 1", st.Denied)
	}
}

func TestUDPEcho(t *testing.T) {
	checkGoroutines(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	p := newPair(t, Config{UDPIdleTimeout: 300 * time.Millisecond})
	p.dial.route("198.51.100.7:7", pc.LocalAddr().String())
	c := p.jobDialUDP(t, "198.51.100.7:7")

	echo := func(i int) {
		t.Helper()
		msg := []byte{byte(i), byte(i >> 8), 'x', 'y'}
		buf := make([]byte, 64)
		for try := 0; ; try++ { // UDP may drop; retry a little
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if _, err := c.Write(msg); err != nil {
				t.Fatalf("datagram %d: write: %v", i, err)
			}
			n, err := c.Read(buf)
			if err == nil {
				if !bytes.Equal(buf[:n], msg) {
					t.Fatalf("datagram %d: got %x, want %x", i, buf[:n], msg)
				}
				return
			}
			if try == 3 {
				t.Fatalf("datagram %d: read: %v", i, err)
			}
		}
	}
	for i := range 100 {
		echo(i)
	}
	if st := p.s.Counters(); st.UDPFlows != 1 {
		t.Errorf("UDPFlows: got %d, want 1", st.UDPFlows)
	}
	// After the idle timeout the flow is gone; the next datagram opens a new one.
	time.Sleep(700 * time.Millisecond)
	echo(100)
	if st := p.s.Counters(); st.UDPFlows != 2 {
		t.Errorf("UDPFlows after idle timeout: got %d, want 2", st.UDPFlows)
	}
}

func TestCloseUnblocksRead(t *testing.T) {
	checkGoroutines(t)
	s, err := New(Config{Logger: testLogger(), Addrs: []netip.Prefix{gwPrefix}, DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		bufs := [][]byte{make([]byte, 2000)}
		_, err := s.Read(bufs, make([]int, 1), 0)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Errorf("Read after Close: got %v, want os.ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Read still blocked 2s after Close")
	}
	if _, err := s.Write([][]byte{{0x45}}, 0); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Write after Close: got %v, want os.ErrClosed", err)
	}
	if _, ok := <-s.Events(); ok {
		// EventUp is buffered; the channel must then be closed.
		if _, ok := <-s.Events(); ok {
			t.Error("Events not closed after Close")
		}
	}
	s.Close() // idempotent
}
