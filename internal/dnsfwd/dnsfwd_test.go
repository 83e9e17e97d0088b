// SPDX-License-Identifier: MIT

package dnsfwd

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// upstream starts a DNS server on loopback answering test.example. with
// 192.0.2.7 and returns its address.
func upstream(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Name == "test.example." {
			rr, _ := dns.NewRR("test.example. 60 IN A 192.0.2.7")
			m.Answer = append(m.Answer, rr)
		} else {
			m.SetRcode(r, dns.RcodeNameError)
		}
		w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

func TestForward(t *testing.T) {
	dead := netip.MustParseAddrPort("127.0.0.1:1") // refused: falls through
	var queries, failures atomic.Int32
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Config{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Upstreams: []netip.AddrPort{dead, upstream(t)},
		Observe: func(failed bool) {
			queries.Add(1)
			if failed {
				failures.Add(1)
			}
		},
	}, pc, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, proto := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: proto, Timeout: 5 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion("test.example.", dns.TypeA)
		r, _, err := c.Exchange(m, pc.LocalAddr().String())
		if err != nil {
			t.Fatalf("%s: %v", proto, err)
		}
		if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.7" {
			t.Errorf("%s: got %v, want test.example. A 192.0.2.7", proto, r.Answer)
		}
	}
	if queries.Load() != 2 || failures.Load() != 0 {
		t.Errorf("observed %d queries, %d failures; want 2, 0", queries.Load(), failures.Load())
	}
}

func TestAllUpstreamsDown(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Config{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
	}, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := new(dns.Msg)
	m.SetQuestion("test.example.", dns.TypeA)
	t0 := time.Now()
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode: got %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if dt := time.Since(t0); dt > 3*time.Second {
		t.Errorf("SERVFAIL took %v", dt)
	}
}

func TestReadResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(p, []byte("# c\nsearch example\nnameserver 203.0.113.53\nnameserver 2001:db8::53\n"), 0o644)
	got, err := ReadResolvConf(p)
	if err != nil || len(got) != 2 || got[0].String() != "203.0.113.53:53" || got[1].String() != "[2001:db8::53]:53" {
		t.Errorf("got %v, %v", got, err)
	}
	os.WriteFile(p, []byte("search example\n"), 0o644)
	if _, err := ReadResolvConf(p); err == nil {
		t.Error("resolv.conf without nameservers accepted")
	}
}

// TestOnlyStandardQueries checks that the relay answers only standard
// queries (issue 25, hole 5): zone transfers (AXFR, IXFR over TCP and UDP),
// NOTIFY, UPDATE and the other opcodes are answered by the relay itself
// (REFUSED, or NOTIMP for an opcode it does not implement) and never
// reach the site's resolvers from the gateway's address, whatever the
// DNS library would let through; a standard query still does.
func TestOnlyStandardQueries(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	// An upstream that takes any message and counts what reached it.
	var reached atomic.Int32
	var last atomic.Value
	upc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upl, err := net.Listen("tcp", upc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		reached.Add(1)
		last.Store(dns.OpcodeToString[r.Opcode] + " " + dns.Type(r.Question[0].Qtype).String())
		m := new(dns.Msg)
		m.SetReply(r)
		w.WriteMsg(m)
	})
	acceptAll := func(dns.Header) dns.MsgAcceptAction { return dns.MsgAccept }
	for _, srv := range []*dns.Server{{PacketConn: upc, Handler: h, MsgAcceptFunc: acceptAll}, {Listener: upl, Handler: h, MsgAcceptFunc: acceptAll}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { srv.Shutdown() })
	}
	s, err := Start(Config{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Upstreams: []netip.AddrPort{netip.MustParseAddrPort(upc.LocalAddr().String())},
	}, pc, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	for _, tc := range []struct {
		name   string
		proto  string
		opcode int
		qtype  uint16
		want   int // rcode
	}{
		{"AXFR", "tcp", dns.OpcodeQuery, dns.TypeAXFR, dns.RcodeRefused},
		{"IXFR over TCP", "tcp", dns.OpcodeQuery, dns.TypeIXFR, dns.RcodeRefused},
		{"IXFR over UDP", "udp", dns.OpcodeQuery, dns.TypeIXFR, dns.RcodeRefused},
		{"AXFR over UDP", "udp", dns.OpcodeQuery, dns.TypeAXFR, dns.RcodeRefused},
		{"TKEY", "udp", dns.OpcodeQuery, dns.TypeTKEY, dns.RcodeRefused},
		{"NOTIFY", "udp", dns.OpcodeNotify, dns.TypeSOA, dns.RcodeNotImplemented},
		{"NOTIFY over TCP", "tcp", dns.OpcodeNotify, dns.TypeSOA, dns.RcodeNotImplemented},
		{"UPDATE", "udp", dns.OpcodeUpdate, dns.TypeSOA, dns.RcodeNotImplemented},
		{"IQUERY", "udp", dns.OpcodeIQuery, dns.TypeA, dns.RcodeNotImplemented},
		{"STATUS", "tcp", dns.OpcodeStatus, dns.TypeA, dns.RcodeNotImplemented},
	} {
		m := new(dns.Msg)
		m.SetQuestion("test.example.", tc.qtype)
		m.Opcode = tc.opcode
		c := &dns.Client{Net: tc.proto, Timeout: 5 * time.Second}
		r, _, err := c.Exchange(m, pc.LocalAddr().String())
		if err != nil {
			t.Errorf("%s: %v, want an answer", tc.name, err)
		} else if r.Rcode != tc.want {
			t.Errorf("%s: rcode %s, want %s", tc.name, dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.want])
		}
		if n := reached.Swap(0); n != 0 {
			t.Errorf("%s reached the upstream (%v)", tc.name, last.Load())
		}
	}
	m := new(dns.Msg)
	m.SetQuestion("test.example.", dns.TypeA)
	if _, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, pc.LocalAddr().String()); err != nil || reached.Load() != 1 {
		t.Errorf("standard query: %v, reached the upstream %d times; want once", err, reached.Load())
	}
}

// TestRoute: a Route that takes a query answers it instead of the
// upstreams, and is told how the job asked; one that leaves it lets the
// upstreams answer.
func TestRoute(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var nets []string
	s, err := Start(Config{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Upstreams: []netip.AddrPort{upstream(t)},
		Route: func(ctx context.Context, req *dns.Msg, network string) (*dns.Msg, bool, error) {
			mu.Lock()
			nets = append(nets, network)
			mu.Unlock()
			if req.Question[0].Name != "routed.example." || network != "tcp" {
				return nil, false, nil
			}
			m := new(dns.Msg)
			m.SetReply(req)
			rr, _ := dns.NewRR("routed.example. 60 IN A 192.0.2.99")
			m.Answer = append(m.Answer, rr)
			return m, true, nil
		},
	}, pc, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct{ proto, name, want string }{
		{"tcp", "routed.example.", "192.0.2.99"},
		{"tcp", "test.example.", "192.0.2.7"},
		{"udp", "routed.example.", ""}, // the upstream: NXDOMAIN
	} {
		c := &dns.Client{Net: tc.proto, Timeout: 5 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(tc.name, dns.TypeA)
		r, _, err := c.Exchange(m, pc.LocalAddr().String())
		if err != nil {
			t.Fatalf("%s %s: %v", tc.proto, tc.name, err)
		}
		got := ""
		if len(r.Answer) == 1 {
			got = r.Answer[0].(*dns.A).A.String()
		}
		if got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.proto, tc.name, got, tc.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(nets) != 3 || nets[0] != "tcp" || nets[2] != "udp" {
		t.Errorf("Route saw %v, want tcp, tcp, udp", nets)
	}
}
