// SPDX-License-Identifier: MIT

package tunnel

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/airlock-vpn/airlock/internal/wgkey"
	"github.com/airlock-vpn/airlock/test/topology"
)

// streamPair connects a client and a gateway WireGuard device only through
// framed TCP streams on loopback: the client's UDP endpoint is a port
// nothing answers on.
type streamPair struct {
	gwTun, clTun *tuntest.ChannelTUN
	gb, cb       *Bind
	ln           net.Listener
}

var (
	gwTunAddr = netip.MustParseAddr("10.0.0.1")
	clTunAddr = netip.MustParseAddr("10.0.0.2")
)

func newStreamPair(t *testing.T) *streamPair {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	p := &streamPair{gwTun: tuntest.NewChannelTUN(), clTun: tuntest.NewChannelTUN()}
	gwPriv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	clPriv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	p.gb = NewBind(conn.NewStdNetBind(), log)
	gw, err := NewGateway(log, p.gwTun.TUN(), 1, p.gb, gwPriv, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	if err := gw.AddPeer(clPriv.PublicKey(), clTunAddr); err != nil {
		t.Fatal(err)
	}
	p.ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.ln.Close() })
	p.cb = NewBind(nil, log)
	cl, err := NewClient(log, p.clTun.TUN(), p.cb, clPriv, gwPriv.PublicKey(), netip.MustParseAddrPort("127.0.0.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	p.connect(t)
	return p
}

// connect opens a stream from the client's bind to the gateway's and
// makes the client send over it.
func (p *streamPair) connect(t *testing.T) {
	t.Helper()
	c, err := net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	remote := netip.MustParseAddrPort(c.LocalAddr().String())
	p.gb.AddStream(s, remote, "gw-side")
	p.cb.UseStream(p.cb.AddStream(c, netip.MustParseAddrPort(p.ln.Addr().String()), "client-side"))
}

// ping sends a packet each way and waits for it.
func (p *streamPair) ping(t *testing.T) {
	t.Helper()
	for _, dir := range []struct {
		in, out *tuntest.ChannelTUN
		pkt     []byte
	}{
		{p.clTun, p.gwTun, tuntest.Ping(gwTunAddr, clTunAddr)},
		{p.gwTun, p.clTun, tuntest.Ping(clTunAddr, gwTunAddr)},
	} {
		dir.in.Outbound <- dir.pkt
		select {
		case got := <-dir.out.Inbound:
			if !bytes.Equal(got, dir.pkt) {
				t.Fatalf("packet changed on the way")
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("packet did not arrive over the stream within 10 s")
		}
	}
}

func TestBindStream(t *testing.T) {
	p := newStreamPair(t)
	p.ping(t)
	if rx, tx := p.gb.Bytes(); rx == 0 || tx == 0 {
		t.Errorf("gateway bind counted rx %d tx %d bytes, want both > 0", rx, tx)
	}
}

// TestBindMalformedStream attaches a second stream that sends garbage: it
// is closed with ErrMalformedFrame, and the first stream keeps working.
func TestBindMalformedStream(t *testing.T) {
	p := newStreamPair(t)
	p.ping(t)
	c, err := net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := p.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	bad := p.gb.AddStream(s, netip.MustParseAddrPort(c.LocalAddr().String()), "garbage")
	c.Write([]byte{0, 40, 7, 7, 7, 7})
	c.Write(make([]byte, 40))
	select {
	case <-bad.Done():
		if !errors.Is(bad.Err(), ErrMalformedFrame) {
			t.Errorf("garbage stream closed with %v, want ErrMalformedFrame", bad.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("garbage stream not closed")
	}
	p.ping(t)
}

// TestBindStreamReplaced closes the client's stream and opens another:
// traffic resumes over the new one.
func TestBindStreamReplaced(t *testing.T) {
	p := newStreamPair(t)
	p.ping(t)
	old := p.cb.Stream()
	old.Close()
	<-old.Done()
	if p.cb.Stream() != nil {
		t.Errorf("closed stream still in use")
	}
	p.connect(t)
	p.ping(t)
}

// TestHandshakeNotify checks that a handshake message arriving over UDP
// or a stream wakes HandshakeNotify's reader, and that other messages do
// not.
func TestHandshakeNotify(t *testing.T) {
	b := NewBind(nil, nil)
	fns, port, err := b.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, fn := range fns {
		go func() {
			n := b.BatchSize()
			bufs := make([][]byte, n)
			for i := range bufs {
				bufs[i] = make([]byte, 1500)
			}
			sizes, eps := make([]int, n), make([]conn.Endpoint, n)
			for {
				if _, err := fn(bufs, sizes, eps); errors.Is(err, net.ErrClosed) {
					return
				}
			}
		}()
	}
	c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	notified := func(within time.Duration) bool {
		select {
		case <-b.HandshakeNotify():
			return true
		case <-time.After(within):
			return false
		}
	}
	// A data message (type 4): no word.
	if _, err := c.Write(append([]byte{4}, make([]byte, 31)...)); err != nil {
		t.Fatal(err)
	}
	if notified(200 * time.Millisecond) {
		t.Errorf("HandshakeNotify after a data message: got a value, want none")
	}
	// A handshake response (type 2), twice: one word.
	for range 2 {
		if _, err := c.Write(append([]byte{2}, make([]byte, 91)...)); err != nil {
			t.Fatal(err)
		}
	}
	if !notified(5 * time.Second) {
		t.Fatalf("HandshakeNotify after a handshake response over UDP: got nothing")
	}
	// Over a stream: a real handshake between two devices.
	p := newStreamPair(t)
	p.ping(t)
	if !topology.Poll(5*time.Second, func() bool {
		select {
		case <-p.cb.HandshakeNotify():
			return true
		default:
			return false
		}
	}) {
		t.Errorf("HandshakeNotify after a handshake over a stream: got nothing")
	}
}
