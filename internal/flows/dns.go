// SPDX-License-Identifier: MIT

package flows

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-vpn/airlock/internal/ipproto"
)

// DNS query records. The gateway's DNS relay (internal/dnsfwd) reports
// every query a job sends to the tunnel address with [Table.DNS]: counted
// by result, and logged to the flow log like a flow (5-tuple, job, token,
// verdict) with a [DNSInfo], at most dnsLogRate records per second per
// job. Queries the relay refused for the job's DNS limits carry a refused
// verdict and count against the same per-job budget as its flow
// refusals' records.

// Verdicts of DNS queries the relay refused (answered REFUSED).
const (
	DNSRate     = "refused:dns-rate"      // over the job's queries per second
	DNSInflight = "refused:dns-inflight"  // over the job's concurrent queries
	DNSNotQuery = "refused:dns-not-query" // a zone transfer or meta query type
)

// DNSInfo is a DNS query and its answer as the flow log records it. Name
// is in presentation format (miekg/dns escapes non-printable bytes as
// \DDD), so it is safe to show.
type DNSInfo struct {
	Name    string `json:"name"`
	Type    string `json:"type"`
	Rcode   string `json:"rcode"`
	Answers int    `json:"answers"`
}

// DNSQuery is one query a job sent to the DNS relay.
type DNSQuery struct {
	Proto ipproto.Proto  // ProtoUDP or ProtoTCP
	Src   netip.AddrPort // the job's address and port
	Dst   netip.AddrPort // the relay's (the tunnel address, port 53)
	// Verdict is Allowed (relayed; Rcode says how it went), DNSRate,
	// DNSInflight or DNSNotQuery.
	Verdict    string
	Info       DNSInfo
	Start, End time.Time
}

// DNS records a job's DNS query: counted by result (the verdict, or for
// relayed queries "answered" or "servfail") and logged, rate-limited per
// job. It does not allocate when the record is suppressed.
func (t *Table) DNS(q DNSQuery) {
	jaddr := q.Src.Addr().Unmap()
	result := q.Verdict
	if result == Allowed {
		result = "answered"
		if q.Info.Rcode == "SERVFAIL" {
			result = "servfail"
		}
	}
	t.dns.add(result)
	t.mu.Lock()
	r, lim := t.attributionLocked(jaddr)
	t.mu.Unlock()
	if t.out == nil {
		return
	}
	budget := &lim.dns
	if q.Verdict != Allowed {
		budget = &lim.refusal
	}
	supp, ok := budget.allow(q.End)
	if !ok {
		t.dns.suppressed.Add(1)
		return
	}
	info := q.Info
	r.ID, r.Proto, r.Src, r.Dst = t.nextID.Add(1), q.Proto.String(), q.Src.String(), q.Dst.String()
	r.Direction, r.Verdict, r.Start, r.End, r.EndReason, r.Suppressed, r.DNS = Egress, q.Verdict, q.Start, q.End, EndClosed, supp, &info
	t.write(r)
}

// logLimits are one job's (or the unknown addresses') log budgets.
type logLimits struct {
	refusal, dns logBudget
}

func newLogLimits() logLimits {
	return logLimits{
		refusal: logBudget{lim: rate.NewLimiter(refusalLogRate, refusalLogBurst)},
		dns:     logBudget{lim: rate.NewLimiter(dnsLogRate, dnsLogBurst)},
	}
}

// logBudget is a rate limit on log records with a count of the records it
// suppressed since it last allowed one.
type logBudget struct {
	lim        *rate.Limiter
	suppressed atomic.Uint64
}

// allow reports whether a record may be logged at now, and if so how many
// were suppressed before it.
func (b *logBudget) allow(now time.Time) (suppressed uint64, ok bool) {
	if !b.lim.AllowN(now, 1) {
		b.suppressed.Add(1)
		return 0, false
	}
	return b.suppressed.Swap(0), true
}

// dnsCounters count DNS queries by result.
type dnsCounters struct {
	mu       sync.Mutex
	byResult map[string]uint64
	// suppressed counts query records not logged (rate limit).
	suppressed atomic.Uint64
}

func (c *dnsCounters) add(result string) {
	c.mu.Lock()
	if c.byResult == nil {
		c.byResult = make(map[string]uint64)
	}
	c.byResult[result]++
	c.mu.Unlock()
}

func (c *dnsCounters) snapshot() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint64, len(c.byResult))
	for k, v := range c.byResult {
		out[k] = v
	}
	return out
}
