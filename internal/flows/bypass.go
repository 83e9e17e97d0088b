// SPDX-License-Identifier: MIT

package flows

import (
	"math"
	"sort"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-vpn/airlock/internal/jobs"
)

// Bypassed is the verdict of a flow log row that aggregates a job's
// site-local bypass: flows its client carried from the compute node
// instead of through the gateway, as the client reported them.
const Bypassed = "bypassed"

// BypassStats are the counts of one bypass entry (Rule): flows and payload
// bytes each way ("out" sent by the job).
type BypassStats struct {
	Rule     string `json:"rule"`
	Flows    uint64 `json:"flows"`
	BytesOut uint64 `json:"bytes_out"`
	BytesIn  uint64 `json:"bytes_in"`
}

// Bounds on what one lease's reports can do (issue 25, hole 2). A client
// reports at every renewal (every renew interval, 30 s by default) and
// once when it releases its lease; counters are cumulative, so a report
// that is dropped loses nothing: the next one carries it.
const (
	// bypassReportRate and bypassReportBurst cap the reports a lease
	// may make; the rest are ignored.
	bypassReportRate  = rate.Limit(1) // per second
	bypassReportBurst = 5
	// bypassRowRate and bypassRowBurst budget a job's bypass rows in the
	// flow log. An increase not logged stays pending and goes into the
	// entry's next row, or into the rows written when the job ends.
	bypassRowRate  = rate.Limit(1) // per second
	bypassRowBurst = 10
)

// jobBypass is one job's bypass state, guarded by Table.mu.
type jobBypass struct {
	last map[string]BypassStats // the client's last accepted report, by rule
	// logged are the counts the job's rows have carried so far, by rule,
	// and loggedAt when the last of them was written.
	logged   map[string]BypassStats
	loggedAt map[string]time.Time
	to       map[string]string // each entry's destinations, for its rows
	// pending is the last report held back by the cap, with its to.
	pending   []BypassStats
	pendingTo func(string) string
	reports   *rate.Limiter // reports accepted (nil until the first)
	rows      *rate.Limiter // flow log rows (nil until the first)
}

// ReportBypass records what the client of job id says it
// carried around the gateway: counts are cumulative for the job's lease,
// by entry, and to names each entry's destinations for the flow log. The
// increase over the previous report goes to the job's and the
// gateway-wide per-entry totals, which saturate at 2^64-1 rather than
// wrap, and to a flow log row with verdict Bypassed and Record.Bypass
// naming the entry, within the job's row budget; the job's end writes
// what its rows have not carried yet (RemoveJob). An entry whose counts
// went down is refused and counted (Stats.BypassRefused): a lease's
// client never starts over. A report beyond bypassReportRate per lease is
// held back, superseded by the next one or applied at the job's end;
// reports for an unknown job are ignored.
func (t *Table) ReportBypass(id jobs.ID, counts []BypassStats, to func(rule string) string) {
	t.reportBypassAt(id, counts, to, time.Now())
}

// reportBypassAt is ReportBypass at time now (tests drive the clock).
func (t *Table) reportBypassAt(id jobs.ID, counts []BypassStats, to func(rule string) string, now time.Time) {
	t.mu.Lock()
	j := t.jobs[id]
	if j == nil {
		t.mu.Unlock()
		return
	}
	b := &j.bypass
	if b.reports == nil {
		b.last, b.logged, b.loggedAt, b.to = map[string]BypassStats{}, map[string]BypassStats{}, map[string]time.Time{}, map[string]string{}
		b.reports = rate.NewLimiter(bypassReportRate, bypassReportBurst)
		b.rows = rate.NewLimiter(bypassRowRate, bypassRowBurst)
	}
	if !b.reports.AllowN(now, 1) {
		// Over the cap: kept, not applied. Counters are cumulative, so
		// the next report supersedes it; the job's end applies it.
		b.pending, b.pendingTo = counts, to
		t.mu.Unlock()
		return
	}
	b.pending, b.pendingTo = nil, nil
	rows, refused := t.applyBypassLocked(j, counts, to, now, true)
	t.mu.Unlock()
	t.bypassWritten(rows, refused, j)
}

// applyBypassLocked applies one report of job j: the totals, and
// the rows the job's budget allows (all pending rows with budget false).
// It returns the rows to write and how many entries it refused. t.mu
// must be held.
func (t *Table) applyBypassLocked(j *job, counts []BypassStats, to func(string) string, now time.Time, budget bool) (rows []Record, refused int) {
	b := &j.bypass
	if t.bypass == nil {
		t.bypass = make(map[string]*BypassStats)
	}
	for _, c := range counts {
		prev := b.last[c.Rule]
		if c.Flows < prev.Flows || c.BytesOut < prev.BytesOut || c.BytesIn < prev.BytesIn {
			refused++
			continue
		}
		d := BypassStats{Flows: c.Flows - prev.Flows, BytesOut: c.BytesOut - prev.BytesOut, BytesIn: c.BytesIn - prev.BytesIn}
		b.last[c.Rule] = c
		if d == (BypassStats{}) {
			continue
		}
		if _, ok := b.to[c.Rule]; !ok {
			b.to[c.Rule] = to(c.Rule)
		}
		g := t.bypass[c.Rule]
		if g == nil {
			g = &BypassStats{Rule: c.Rule}
			t.bypass[c.Rule] = g
		}
		g.Flows = satAdd(g.Flows, d.Flows)
		g.BytesOut = satAdd(g.BytesOut, d.BytesOut)
		g.BytesIn = satAdd(g.BytesIn, d.BytesIn)
		if budget && b.rows.AllowN(now, 1) {
			rows = append(rows, t.bypassRowLocked(j, c.Rule, now))
		}
	}
	t.bypassRefused += uint64(refused)
	return rows, refused
}

// bypassWritten writes rows and warns (rate-limited) about refused
// entries of job j (its id, address and ref are fixed).
func (t *Table) bypassWritten(rows []Record, refused int, j *job) {
	if refused > 0 && t.warnLim.Allow() {
		t.log.Warn("bypass report refused: counters went down (a client reports cumulative counters per lease)",
			"job_addr", j.addr, "lease", j.id, "job", j.ref.JobID, "entries", refused)
	}
	for _, r := range rows {
		t.write(r)
	}
}

// bypassRowLocked returns the flow log row of rule for job j (from its
// first address): the increase since its last row, and marks it logged.
// t.mu must be held.
func (t *Table) bypassRowLocked(j *job, rule string, now time.Time) Record {
	b := &j.bypass
	cur, was := b.last[rule], b.logged[rule]
	since, ok := b.loggedAt[rule]
	if !ok {
		since = j.start
	}
	b.logged[rule], b.loggedAt[rule] = cur, now
	return Record{
		ID: t.nextID.Add(1), Proto: "any", Src: addrString(j.addr), Dst: b.to[rule], Direction: Egress,
		JobAddr: addrString(j.addr), Lease: j.id, Ref: j.ref, Verdict: Bypassed,
		BytesOut: cur.BytesOut - was.BytesOut, BytesIn: cur.BytesIn - was.BytesIn, Flows: cur.Flows - was.Flows, Bypass: rule,
		Start: since, End: now, EndReason: "reported",
	}
}

// bypassEndLocked applies j's last report held back by the cap and
// returns the rows of its increases that no row has carried yet, for the
// end of the job. t.mu must be held.
func (t *Table) bypassEndLocked(j *job, now time.Time) (rows []Record, refused int) {
	b := &j.bypass
	if b.pending != nil {
		_, refused = t.applyBypassLocked(j, b.pending, b.pendingTo, now, false)
		b.pending, b.pendingTo = nil, nil
	}
	for rule, cur := range b.last {
		if cur != b.logged[rule] {
			rows = append(rows, t.bypassRowLocked(j, rule, now))
		}
	}
	sort.Slice(rows, func(a, c int) bool { return rows[a].Bypass < rows[c].Bypass })
	return rows, refused
}

// satAdd is a+b, or 2^64-1 if that overflows.
func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// bypassOfLocked returns j's reported bypass counts, by rule.
func bypassOfLocked(j *job) []BypassStats {
	if len(j.bypass.last) == 0 {
		return nil
	}
	out := make([]BypassStats, 0, len(j.bypass.last))
	for _, c := range j.bypass.last {
		out = append(out, c)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Rule < out[b].Rule })
	return out
}

// bypassTotalsLocked returns the gateway-wide bypass counts, by rule.
func (t *Table) bypassTotalsLocked() []BypassStats {
	out := make([]BypassStats, 0, len(t.bypass))
	for _, g := range t.bypass {
		out = append(out, *g)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Rule < out[b].Rule })
	return out
}
