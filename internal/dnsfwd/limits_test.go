// SPDX-License-Identifier: MIT

package dnsfwd

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// slowUpstream answers every query after delay.
func slowUpstream(t *testing.T, delay time.Duration) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		time.Sleep(delay)
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 192.0.2.7")
		m.Answer = append(m.Answer, rr)
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

// query sends one UDP query from local (an address on loopback) to srv and
// returns the rcode (-1 on no answer).
func query(t *testing.T, local netip.Addr, srv string, name string) int {
	c := &dns.Client{Net: "udp", Timeout: 3 * time.Second,
		Dialer: &net.Dialer{LocalAddr: &net.UDPAddr{IP: local.AsSlice()}}}
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, _, err := c.Exchange(m, srv)
	if err != nil {
		return -1
	}
	return r.Rcode
}

// TestJobLimits: a job over its queries per second or its concurrent
// queries gets REFUSED at once, counted and logged as such, while another
// job (another source address, default limits) is answered.
func TestJobLimits(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ml := &memLog{}
	tb := flows.New(flows.Config{Log: ml})
	flooder, quiet := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	for _, j := range []struct {
		id    jobs.ID
		addr  netip.Addr
		batch string
	}{{"LF", flooder, "flooder"}, {"LQ", quiet, "quiet"}} {
		if err := tb.Index().Add(j.id, j.addr); err != nil {
			t.Fatal(err)
		}
		tb.AddJob(j.id, jobs.Ref{JobID: j.batch})
	}
	s, err := Start(Config{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Upstreams: []netip.AddrPort{slowUpstream(t, 300*time.Millisecond)},
		Flows:     tb,
	}, pc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv := pc.LocalAddr().String()
	if err := s.Limiter().SetJob([]netip.Addr{flooder}, Limits{MaxInflight: 2, PerSec: 5}); err != nil {
		t.Fatal(err)
	}
	if err := s.Limiter().SetJob([]netip.Addr{flooder}, Limits{MaxInflight: -1}); err == nil {
		t.Error("SetJobLimits accepted a negative limit")
	}

	// Concurrency: 8 at once, 2 are relayed (slowly), 6 refused at once.
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := query(t, flooder, srv, "c.example.")
			mu.Lock()
			got[rc]++
			mu.Unlock()
		}()
	}
	// Meanwhile the quiet job is answered.
	if rc := query(t, quiet, srv, "q.example."); rc != dns.RcodeSuccess {
		t.Errorf("quiet job during the flood: rcode %d, want NOERROR", rc)
	}
	wg.Wait()
	if got[dns.RcodeSuccess] != 2 || got[dns.RcodeRefused] != 6 {
		t.Errorf("8 concurrent queries with max in-flight 2: rcodes %v, want 2 NOERROR, 6 REFUSED", got)
	}

	// Rate: 10 at once at 5/s (in-flight not binding): the bucket's 5
	// are relayed, the rest refused at once.
	if err := s.Limiter().SetJob([]netip.Addr{flooder}, Limits{MaxInflight: 100, PerSec: 5}); err != nil {
		t.Fatal(err)
	}
	got = map[int]int{}
	start := time.Now()
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := query(t, flooder, srv, "r.example.")
			mu.Lock()
			got[rc]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if got[dns.RcodeRefused] < 4 || got[dns.RcodeSuccess] < 5 {
		t.Errorf("10 queries at once at 5/s: rcodes %v, want 5 (or 6) NOERROR, the rest REFUSED", got)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("10 queries took %v", d)
	}
	st := tb.Stats()
	if st.DNS[flows.DNSInflight] != 6 || st.DNS[flows.DNSRate] < 4 || st.DNS["answered"] < 8 {
		t.Errorf("DNS counts %v", st.DNS)
	}
	var logged, quietLogged int
	for _, r := range ml.all() {
		if r.JobID == "flooder" && r.Verdict == flows.DNSInflight && r.DNS != nil && r.DNS.Rcode == "REFUSED" && r.DNS.Name == "c.example." {
			logged++
		}
		if r.JobID == "quiet" && r.Verdict == flows.Allowed && r.DNS != nil && r.DNS.Name == "q.example." && r.DNS.Answers == 1 && r.Proto == "udp" {
			quietLogged++
		}
	}
	if logged != 6 || quietLogged != 1 {
		t.Errorf("flow log: %d in-flight refusals of the flooder, %d answered queries of the quiet job; want 6, 1", logged, quietLogged)
	}

	// Back to the defaults, and forgotten.
	if err := s.Limiter().SetJob([]netip.Addr{flooder}, Limits{}); err != nil {
		t.Fatal(err)
	}
	if rc := query(t, flooder, srv, "d.example."); rc != dns.RcodeSuccess {
		t.Errorf("after restoring the defaults: rcode %d, want NOERROR", rc)
	}
	s.Limiter().RemoveJob([]netip.Addr{flooder})
}

// TestLimiterBucket checks the admission logic with a fake clock.
func TestLimiterBucket(t *testing.T) {
	var l Limiter
	a := netip.MustParseAddr("100.64.0.2")
	now := time.Unix(1000, 0)
	l.setJob([]netip.Addr{a}, Limits{MaxInflight: 100, PerSec: 2}, now)
	var res []int
	for range 3 {
		r := l.admit(a, now)
		if r == admitted {
			l.done(a)
		}
		res = append(res, r)
	}
	if res[0] != admitted || res[1] != admitted || res[2] != overRate {
		t.Errorf("3 queries at once at 2/s: %v, want admitted, admitted, over rate", res)
	}
	if r := l.admit(a, now.Add(600*time.Millisecond)); r != admitted {
		t.Errorf("after 0.6 s: %d, want admitted", r)
	}
	// Defaults for an unknown source.
	b := netip.MustParseAddr("100.64.0.3")
	n := 0
	for range DefaultPerSec + 10 {
		if l.admit(b, now) == admitted {
			l.done(b)
			n++
		}
	}
	if n != DefaultPerSec {
		t.Errorf("unknown source: %d admitted at once, want the default %d", n, DefaultPerSec)
	}
}

type memLog struct {
	mu   sync.Mutex
	recs []flows.Record
}

func (m *memLog) WriteRecord(r flows.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, r)
	return nil
}

func (m *memLog) all() []flows.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]flows.Record(nil), m.recs...)
}

// TestTCPConnLimit (issue 25, hole 4): a job's DNS connections over TCP are
// bounded like its queries: beyond its max in-flight, new connections are
// closed at once rather than each holding a goroutine of the relay; another
// job still connects, and a connection freed makes room.
func TestTCPConnLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Config{Logger: slog.New(slog.DiscardHandler), Upstreams: []netip.AddrPort{upstream(t)}}, nil, ln)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	job, other := netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3")
	if err := s.Limiter().SetJob([]netip.Addr{job}, Limits{MaxInflight: 2}); err != nil {
		t.Fatal(err)
	}
	dial := func(from netip.Addr) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}, Timeout: 3 * time.Second}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The relay's TCP idle timeout (2 s) closes every idle connection in
	// the end: what counts is which it closes at once.
	closedAll := func(cs []net.Conn) []bool {
		out := make([]bool, len(cs))
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				_, err := c.Read(make([]byte, 1))
				out[i] = errors.Is(err, io.EOF)
				c.SetReadDeadline(time.Time{})
			}()
		}
		wg.Wait()
		return out
	}
	var conns []net.Conn
	for range 6 {
		conns = append(conns, dial(job))
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	o := dial(other)
	defer o.Close()
	res := closedAll(append(conns, o))
	n := 0
	var open net.Conn
	for i, c := range conns {
		if res[i] {
			n++
		} else if open == nil {
			open = c
		}
	}
	if n != 4 {
		t.Errorf("%d of 6 idle TCP connections of a job with max in-flight 2 closed at once, want 4", n)
	}
	if res[6] {
		t.Error("another job's TCP connection closed")
	}
	if open == nil {
		t.Fatal("none of the job's TCP connections stayed open")
	}
	// The job's open connections still answer.
	conn := &dns.Conn{Conn: open}
	m := new(dns.Msg)
	m.SetQuestion("test.example.", dns.TypeA)
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	if err := conn.WriteMsg(m); err != nil {
		t.Fatal(err)
	}
	if r, err := conn.ReadMsg(); err != nil || len(r.Answer) != 1 {
		t.Errorf("query over the job's open TCP connection: %v %v, want an answer", r, err)
	}
}

// TestLimiterJobAcrossAddresses: a job's addresses of both families share
// one budget (a dual-stack job got its DNS budget twice when each
// family's relay limited per source address); another job keeps its own.
func TestLimiterJobAcrossAddresses(t *testing.T) {
	var l Limiter
	v4, v6 := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("fd00::2")
	other := netip.MustParseAddr("100.64.0.3")
	now := time.Unix(1000, 0)
	// A query in flight from v6 before the job's limits are set is
	// carried into the job's state.
	if r := l.admit(v6, now); r != admitted {
		t.Fatalf("first query: %d, want admitted", r)
	}
	if err := l.SetJob([]netip.Addr{v4, v6}, Limits{MaxInflight: 2, PerSec: 3}); err != nil {
		t.Fatal(err)
	}
	if err := l.SetJob([]netip.Addr{other}, Limits{MaxInflight: 2, PerSec: 3}); err != nil {
		t.Fatal(err)
	}
	if r := l.admit(v4, now); r != admitted {
		t.Errorf("v4 query with one v6 query in flight under 2: %d, want admitted", r)
	}
	if r := l.admit(v6, now); r != overInflight {
		t.Errorf("third query in flight across families under 2: %d, want over in-flight", r)
	}
	l.done(v6)
	l.done(v4)
	if r := l.admit(v6, now); r != admitted {
		t.Errorf("v6 query after both ended: %d, want admitted", r)
	}
	l.done(v6)
	if r := l.admit(v4, now); r != admitted {
		t.Errorf("third query in one instant at 3/s: %d, want admitted", r)
	}
	l.done(v4)
	if r := l.admit(v6, now); r != overRate {
		t.Errorf("fourth query in one instant at 3/s, over both families: %d, want over rate", r)
	}
	if r := l.admit(other, now); r != admitted {
		t.Errorf("another job's query: %d, want admitted", r)
	}
	l.RemoveJob([]netip.Addr{v4, v6})
	if r := l.admit(v6, now); r != admitted {
		t.Errorf("after RemoveJob, defaults: %d, want admitted", r)
	}
}
