// SPDX-License-Identifier: MIT

package client

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-vpn/airlock/internal/bypass"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/ipproto"
)

// dnsServer answers every A question with addr, over UDP and TCP on
// 127.0.0.1 (one port for both), and returns that address.
func dnsServer(t *testing.T, addr string) netip.AddrPort {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A " + addr)
		m.Answer = append(m.Answer, rr)
		w.WriteMsg(m)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort(l.Addr().String())
	pc, err := net.ListenPacket("udp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*dns.Server{{Listener: l, Handler: h}, {PacketConn: pc, Handler: h}} {
		go s.ActivateAndServe()
		t.Cleanup(func() { s.Shutdown() })
	}
	return ap
}

func query(name string) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	b, _ := m.Pack()
	return b
}

func answer(t *testing.T, b []byte) string {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil || len(m.Answer) != 1 {
		t.Fatalf("answer %x: %v", b, err)
	}
	return m.Answer[0].(*dns.A).A.String()
}

// TestSplitDNS checks the fallback modes' DNS to the tunnel's server:
// queries for local names go to the site resolver, others to the tunnel,
// over UDP (seccomp) and TCP (the preload library).
func TestSplitDNS(t *testing.T) {
	site := dnsServer(t, "10.20.0.5")
	tunnelDNS := dnsServer(t, "192.0.2.1") // stands for the gateway's
	eng := bypass.NewEngine(slog.New(slog.DiscardHandler))
	if err := eng.Update(&control.Bypass{Rules: []control.Rule{}, LocalDomains: []string{"site.test"},
		Resolvers: []netip.AddrPort{site}, Policy: control.Policy{Default: "allow"}}); err != nil {
		t.Fatal(err)
	}

	tc, err := net.Dial("udp", tunnelDNS.String())
	if err != nil {
		t.Fatal(err)
	}
	u := newSplitDNS(tc, eng)
	defer u.Close()
	buf := make([]byte, 4096)
	for name, want := range map[string]string{"squid.site.test.": "10.20.0.5", "example.org.": "192.0.2.1"} {
		if _, err := u.Write(query(name)); err != nil {
			t.Fatal(err)
		}
		n, err := u.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if got := answer(t, buf[:n]); got != want {
			t.Errorf("udp %s: %s, want %s", name, got, want)
		}
	}

	d := bypassDialer{eng: eng, dns: netip.MustParseAddr("100.64.0.1")}
	c := &splitDNSTCP{d: d, ready: make(chan struct{})}
	defer c.Close()
	q := query("files.site.test.")
	frame := binary.BigEndian.AppendUint16(nil, uint16(len(q)))
	// Written in two pieces: it decides once the query is whole.
	c.Write(append(frame, q[:5]...))
	c.Write(q[5:])
	var l [2]byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.ReadFull(c, l[:]); err != nil {
			t.Error(err)
			return
		}
		b := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Error(err)
			return
		}
		if got := answer(t, b); got != "10.20.0.5" {
			t.Errorf("tcp files.site.test: %s, want the site resolver's 10.20.0.5", got)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no answer over TCP within 5 s")
	}
}

// fakeTunnel is a tunnel's UDP socket: it records what is written to it
// and answers each datagram with the same bytes, from its destination.
type fakeTunnel struct {
	net.PacketConn // nil: only the methods below
	sent           chan netip.AddrPort
	replies        chan udpDatagram
	closed         chan struct{}
}

func (f *fakeTunnel) WriteTo(b []byte, addr net.Addr) (int, error) {
	ap := netip.MustParseAddrPort(addr.String())
	f.sent <- ap
	f.replies <- udpDatagram{append([]byte(nil), b...), ap}
	return len(b), nil
}

func (f *fakeTunnel) ReadFrom(b []byte) (int, net.Addr, error) {
	select {
	case d := <-f.replies:
		return copy(b, d.b), net.UDPAddrFromAddrPort(d.from), nil
	case <-f.closed:
		return 0, nil, net.ErrClosed
	}
}

func (f *fakeTunnel) Close() error { close(f.closed); return nil }

// TestBypassPacketConn checks a SOCKS UDP association's bypass: a query
// for a local name to the tunnel's DNS server is answered by the site
// resolver, as from the tunnel's server; other queries and other
// destinations go into the tunnel; a datagram a bypass entry takes but the
// gateway's policy denies is dropped, not sent into the tunnel.
func TestBypassPacketConn(t *testing.T) {
	site := dnsServer(t, "10.20.0.5")
	eng := bypass.NewEngine(slog.New(slog.DiscardHandler))
	if err := eng.Update(&control.Bypass{
		Rules:        []control.Rule{{Name: "squid", To: []netip.Prefix{netip.MustParsePrefix("10.20.0.5/32")}, Proto: ipproto.UDP, Ports: [][2]uint16{{3128, 3128}}}},
		LocalDomains: []string{"site.test"}, Resolvers: []netip.AddrPort{site},
		Policy: control.Policy{Default: "deny"}}); err != nil {
		t.Fatal(err)
	}
	dnsAddr := netip.MustParseAddr("100.64.0.1")
	tun := &fakeTunnel{sent: make(chan netip.AddrPort, 8), replies: make(chan udpDatagram, 8), closed: make(chan struct{})}
	p := newBypassPacketConn(tun, bypassDialer{eng: eng, dns: dnsAddr})
	defer p.Close()
	dnsAP := netip.AddrPortFrom(dnsAddr, 53)
	read := func() (string, netip.AddrPort) {
		t.Helper()
		buf := make([]byte, 4096)
		got := make(chan struct{})
		var n int
		var from net.Addr
		var err error
		go func() { n, from, err = p.ReadFrom(buf); close(got) }()
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("no datagram within 5 s")
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n]), netip.MustParseAddrPort(from.String())
	}
	// A local name: the site resolver answers, as from the tunnel's DNS.
	if _, err := p.WriteTo(query("squid.site.test."), net.UDPAddrFromAddrPort(dnsAP)); err != nil {
		t.Fatal(err)
	}
	b, from := read()
	if got := answer(t, []byte(b)); got != "10.20.0.5" || from != dnsAP {
		t.Errorf("local query: %s from %s, want 10.20.0.5 from %s", got, from, dnsAP)
	}
	select {
	case ap := <-tun.sent:
		t.Errorf("the local query went into the tunnel (to %s)", ap)
	default:
	}
	// Another name, and another destination: into the tunnel.
	for _, dst := range []netip.AddrPort{dnsAP, netip.MustParseAddrPort("192.0.2.7:9")} {
		msg := query("example.org.")
		if _, err := p.WriteTo(msg, net.UDPAddrFromAddrPort(dst)); err != nil {
			t.Fatal(err)
		}
		if ap := <-tun.sent; ap != dst {
			t.Errorf("sent into the tunnel to %s, want %s", ap, dst)
		}
		if b, from := read(); b != string(msg) || from != dst {
			t.Errorf("tunnel reply from %s, want the echo from %s", from, dst)
		}
	}
	// The entry's destination, denied by the gateway's policy: dropped.
	if _, err := p.WriteTo([]byte("x"), net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.20.0.5:3128"))); err == nil {
		t.Error("a datagram the bypass takes and the policy denies: written")
	}
	select {
	case ap := <-tun.sent:
		t.Errorf("the denied datagram went into the tunnel (to %s)", ap)
	default:
	}
}
