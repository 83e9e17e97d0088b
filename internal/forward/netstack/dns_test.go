// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// startUpstream runs a DNS server on loopback UDP and TCP (same port)
// answering test.airlock. A 192.0.2.1 and, for big.airlock., more records than
// fit a 512-byte UDP answer.
func startUpstream(t *testing.T) netip.AddrPort {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		q := req.Question[0]
		switch q.Name {
		case "test.airlock.":
			rr, _ := dns.NewRR("test.airlock. 60 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		case "big.airlock.":
			for i := range 60 {
				rr, _ := dns.NewRR("big.airlock. 60 IN TXT \"record number " + string(rune('a'+i%26)) + " padding padding\"")
				m.Answer = append(m.Answer, rr)
			}
		default:
			m.Rcode = dns.RcodeNameError
		}
		if _, ok := w.RemoteAddr().(*net.UDPAddr); ok {
			m.Truncate(dns.MinMsgSize)
		}
		w.WriteMsg(m)
	})
	for try := 0; ; try++ {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err != nil {
			pc.Close()
			if try < 10 {
				continue
			}
			t.Fatal(err)
		}
		for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			go srv.ActivateAndServe()
			<-started
			t.Cleanup(func() { srv.Shutdown() })
		}
		return netip.MustParseAddrPort(pc.LocalAddr().String())
	}
}

// query asks the gateway's DNS server from the job stack.
func (p *pair) query(t *testing.T, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	dnsAddr := netip.AddrPortFrom(gwPrefix.Addr(), 53).String()
	var conn net.Conn
	if network == "udp" {
		conn = p.jobDialUDP(t, dnsAddr)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := p.jobDialTCP(ctx, dnsAddr)
		if err != nil {
			t.Fatalf("job dial dns over tcp: %v", err)
		}
		defer c.Close()
		conn = c
	}
	co := &dns.Conn{Conn: conn}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if err := co.WriteMsg(m); err != nil {
		t.Fatalf("dns %s write: %v", network, err)
	}
	resp, err := co.ReadMsg()
	if err != nil {
		t.Fatalf("dns %s read: %v", network, err)
	}
	if resp.Id != m.Id {
		t.Errorf("dns %s id: got %d, want %d", network, resp.Id, m.Id)
	}
	return resp
}

func TestDNS(t *testing.T) {
	checkGoroutines(t)
	up := startUpstream(t)
	p := newPair(t, Config{DNSUpstreams: []netip.AddrPort{up}})
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			resp := p.query(t, network, "test.airlock.", dns.TypeA)
			if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
				t.Fatalf("got %v, want one answer", resp)
			}
			a, ok := resp.Answer[0].(*dns.A)
			if !ok || a.A.String() != "192.0.2.1" {
				t.Errorf("answer: got %v, want A 192.0.2.1", resp.Answer[0])
			}
		})
	}
	t.Run("truncated", func(t *testing.T) {
		if resp := p.query(t, "udp", "big.airlock.", dns.TypeTXT); !resp.Truncated {
			t.Errorf("udp answer for big.airlock.: TC not set (%d answers)", len(resp.Answer))
		}
		if resp := p.query(t, "tcp", "big.airlock.", dns.TypeTXT); resp.Truncated || len(resp.Answer) != 60 {
			t.Errorf("tcp answer for big.airlock.: got TC=%v with %d answers, want 60", resp.Truncated, len(resp.Answer))
		}
	})
	if calls := p.dial.Calls(); len(calls) != 0 {
		t.Errorf("DNS went through the flow dialer: %q", calls)
	}
}

func TestDNSUpstreamDown(t *testing.T) {
	checkGoroutines(t)
	down := netip.MustParseAddrPort(closedPort(t, "udp"))
	p := newPair(t, Config{DNSUpstreams: []netip.AddrPort{down}})
	for _, network := range []string{"udp", "tcp"} {
		start := time.Now()
		resp := p.query(t, network, "test.airlock.", dns.TypeA)
		if resp.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s: rcode: got %s, want SERVFAIL", network, dns.RcodeToString[resp.Rcode])
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("%s: SERVFAIL took %v", network, d)
		}
	}
	if st := p.s.Counters(); st.DNSFailures != 2 {
		t.Errorf("DNSFailures: got %d, want 2", st.DNSFailures)
	}
}

func TestDNSFallsBackToNextUpstream(t *testing.T) {
	checkGoroutines(t)
	down := netip.MustParseAddrPort(closedPort(t, "udp"))
	p := newPair(t, Config{DNSUpstreams: []netip.AddrPort{down, startUpstream(t)}})
	if resp := p.query(t, "udp", "test.airlock.", dns.TypeA); len(resp.Answer) != 1 {
		t.Errorf("got %v, want the second upstream's answer", resp)
	}
}
