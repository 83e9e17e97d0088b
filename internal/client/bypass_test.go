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
