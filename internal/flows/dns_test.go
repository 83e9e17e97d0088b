// SPDX-License-Identifier: MIT

package flows

import (
	"github.com/airlock-vpn/airlock/internal/jobs"
	"net/netip"
	"testing"
	"time"
)

// TestRefuseLimitedPerJob: one job's flood of refusals uses up its own log
// budget only; another job's refusals and DNS records are still logged.
func TestRefuseLimitedPerJob(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	jobB := netip.MustParseAddr("100.64.0.3")
	addJob(t, tb, "LA", jobs.Ref{JobID: "flooder"}, jobA)
	addJob(t, tb, "LB", jobs.Ref{JobID: "quiet"}, jobB)
	for range 10 * refusalLogBurst {
		tb.Refuse(key(ProtoTCP, netip.AddrPortFrom(jobA, 1), out1), Egress, FlowLimit)
		tb.DNS(DNSQuery{Proto: ProtoUDP, Src: netip.AddrPortFrom(jobA, 2), Dst: netip.MustParseAddrPort("100.64.0.1:53"),
			Verdict: DNSRate, Info: DNSInfo{Name: "x.example.", Type: "A", Rcode: "REFUSED"}, End: time.Now()})
	}
	tb.Refuse(key(ProtoTCP, netip.AddrPortFrom(jobB, 1), out1), Egress, Denied("no-smtp"))
	tb.DNS(DNSQuery{Proto: ProtoUDP, Src: netip.AddrPortFrom(jobB, 2), Dst: netip.MustParseAddrPort("100.64.0.1:53"),
		Verdict: Allowed, Info: DNSInfo{Name: "b.example.", Type: "AAAA", Rcode: "NOERROR", Answers: 1}, End: time.Now()})
	var a, bRefuse, bDNS int
	for _, r := range ml.all() {
		switch {
		case r.JobID == "flooder":
			a++
		case r.JobID == "quiet" && r.DNS == nil:
			bRefuse++
		case r.JobID == "quiet" && r.DNS.Name == "b.example." && r.DNS.Type == "AAAA" && r.DNS.Answers == 1 && r.DNS.Rcode == "NOERROR":
			bDNS++
		}
	}
	if a > refusalLogBurst+2 {
		t.Errorf("flooding job: %d records logged, want at most about its burst %d (refusals and DNS refusals share it)", a, refusalLogBurst)
	}
	if bRefuse != 1 || bDNS != 1 {
		t.Errorf("quiet job: %d refusal and %d DNS records logged, want 1 and 1 despite the other job's flood", bRefuse, bDNS)
	}
	st := tb.Stats()
	if st.DNS[DNSRate] != 10*refusalLogBurst || st.DNS["answered"] != 1 {
		t.Errorf("DNS counts %v", st.DNS)
	}
}

// TestDNSRecordsLimited: a job's answered queries are logged up to its
// DNS log budget, and the suppressed ones are counted.
func TestDNSRecordsLimited(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	addJob(t, tb, "LA", jobs.Ref{}, jobA)
	const n = 3 * dnsLogBurst
	for i := range n {
		rc := "NOERROR"
		if i == 0 {
			rc = "SERVFAIL"
		}
		tb.DNS(DNSQuery{Proto: ProtoTCP, Src: netip.AddrPortFrom(jobA, 2), Dst: netip.MustParseAddrPort("100.64.0.1:53"),
			Verdict: Allowed, Info: DNSInfo{Name: "a.example.", Type: "A", Rcode: rc}, End: time.Now()})
	}
	recs := ml.all()
	if len(recs) < dnsLogBurst || len(recs) > dnsLogBurst+5 {
		t.Errorf("logged %d DNS records, want about the burst %d", len(recs), dnsLogBurst)
	}
	if r := recs[0]; r.Proto != "tcp" || r.Verdict != Allowed || r.Dst != "100.64.0.1:53" || r.DNS == nil || r.DNS.Rcode != "SERVFAIL" {
		t.Errorf("first record %+v", r)
	}
	st := tb.Stats()
	if st.DNS["servfail"] != 1 || st.DNS["answered"] != n-1 || st.DNSLogSuppressed != uint64(n-len(recs)) {
		t.Errorf("stats: DNS %v, suppressed %d; want servfail 1, answered %d, suppressed %d", st.DNS, st.DNSLogSuppressed, n-1, n-len(recs))
	}
}
