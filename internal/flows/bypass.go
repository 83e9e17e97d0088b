package flows

import (
	"net/netip"
	"sort"
	"time"
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

// jobBypass is one job's bypass state, guarded by Table.mu.
type jobBypass struct {
	last map[string]BypassStats // the client's last report, by rule
	at   time.Time              // when it came (zero: none yet)
}

// ReportBypass records what the client of the job at addr says it
// carried around the gateway: counts are cumulative for the job's lease,
// by entry, and to names each entry's destinations for the flow log. The
// increase over the previous report goes to the job's and the
// gateway-wide per-entry totals and, for each entry that grew, to one flow
// log row with verdict Bypassed and Record.Bypass naming the entry. A
// count that went down starts over (a new client). Reports for an unknown
// job are ignored.
func (t *Table) ReportBypass(addr netip.Addr, counts []BypassStats, to func(rule string) string) {
	now := time.Now()
	addr = addr.Unmap()
	var rows []Record
	t.mu.Lock()
	j := t.jobs[addr]
	if j == nil {
		t.mu.Unlock()
		return
	}
	if j.bypass.last == nil {
		j.bypass.last = make(map[string]BypassStats)
	}
	since := j.bypass.at
	if since.IsZero() {
		since = j.start
	}
	if t.bypass == nil {
		t.bypass = make(map[string]*BypassStats)
	}
	for _, c := range counts {
		prev := j.bypass.last[c.Rule]
		d := BypassStats{Rule: c.Rule, Flows: grow(prev.Flows, c.Flows), BytesOut: grow(prev.BytesOut, c.BytesOut), BytesIn: grow(prev.BytesIn, c.BytesIn)}
		j.bypass.last[c.Rule] = c
		if d.Flows == 0 && d.BytesOut == 0 && d.BytesIn == 0 {
			continue
		}
		g := t.bypass[c.Rule]
		if g == nil {
			g = &BypassStats{Rule: c.Rule}
			t.bypass[c.Rule] = g
		}
		g.Flows += d.Flows
		g.BytesOut += d.BytesOut
		g.BytesIn += d.BytesIn
		rows = append(rows, Record{
			ID: t.nextID.Add(1), Proto: "any", Src: addr.String(), Dst: to(c.Rule), Direction: Egress,
			JobAddr: addr.String(), JobRef: j.ref, Verdict: Bypassed,
			BytesOut: d.BytesOut, BytesIn: d.BytesIn, Flows: d.Flows, Bypass: c.Rule,
			Start: since, End: now, EndReason: "reported",
		})
	}
	j.bypass.at = now
	t.mu.Unlock()
	for _, r := range rows {
		t.write(r)
	}
}

// grow is how much a cumulative counter grew from prev to cur; a counter
// that went down started over.
func grow(prev, cur uint64) uint64 {
	if cur < prev {
		return cur
	}
	return cur - prev
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
