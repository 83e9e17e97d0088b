// SPDX-License-Identifier: MIT

package flows

import (
	"encoding/binary"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/jobs"
)

// TestReportBypass checks that a client's cumulative bypass counts become
// per-job counts, gateway totals by rule and one flow log row per rule
// that grew, with the increase since the previous report.
func TestReportBypass(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	job := netip.MustParseAddr("100.64.0.2")
	addJob(t, tb, "L", jobs.Ref{JobID: "42", Token: "cms"}, job)
	to := func(string) string { return "10.20.0.5/32" }

	tb.ReportBypass("L", []BypassStats{{Rule: "squid", Flows: 2, BytesOut: 100, BytesIn: 5000}}, to)
	tb.ReportBypass("L", []BypassStats{{Rule: "squid", Flows: 2, BytesOut: 100, BytesIn: 5000}}, to) // no change: no row
	tb.ReportBypass("L", []BypassStats{{Rule: "squid", Flows: 3, BytesOut: 150, BytesIn: 9000}, {Rule: "xrootd", Flows: 1, BytesIn: 7}}, to)
	tb.ReportBypass("L9", []BypassStats{{Rule: "squid", Flows: 99}}, to) // unknown job

	rows := ml.all()
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3: %+v", len(rows), rows)
	}
	r := rows[1]
	if r.Verdict != Bypassed || r.Bypass != "squid" || r.Flows != 1 || r.BytesOut != 50 || r.BytesIn != 4000 ||
		r.Dst != "10.20.0.5/32" || r.JobID != "42" || r.JobAddr != job.String() || r.End.Before(r.Start) {
		t.Errorf("second row %+v, want the increase 1 flow, 50 out, 4000 in for squid", r)
	}
	st := tb.Stats()
	if len(st.Bypass) != 2 || st.Bypass[0] != (BypassStats{Rule: "squid", Flows: 3, BytesOut: 150, BytesIn: 9000}) || st.Bypass[1].Rule != "xrootd" {
		t.Errorf("totals %+v", st.Bypass)
	}
	if st.BytesIn != 0 || st.Flows != 0 {
		t.Errorf("bypassed bytes or flows in the gateway's own totals: %+v", st)
	}
	js := tb.Jobs()
	if len(js) != 1 || len(js[0].Bypass) != 2 || js[0].Bypass[0].BytesIn != 9000 {
		t.Errorf("job stats %+v", js)
	}
	// Counts that went down are refused (a lease's client never starts
	// over) and counted; the totals stay.
	tb.ReportBypass("L", []BypassStats{{Rule: "squid", Flows: 1, BytesIn: 10}}, to)
	if st := tb.Stats(); st.Bypass[0].Flows != 3 || st.Bypass[0].BytesIn != 9000 || st.BypassRefused != 1 {
		t.Errorf("after counts went down: %+v, refused %d; want 3 flows, 9000 in, 1 refused", st.Bypass[0], st.BypassRefused)
	}
}

// TestReportBypassHostile checks what a client with a valid lease can do
// with its bypass reports (issue 25, hole 2): counters that go down are
// refused, not taken as a new client, so alternating 0 and 2^64-1 cannot
// wrap the gateway's totals (Prometheus counters never run backwards);
// totals saturate; a flood of reports is capped per lease and its flow
// log rows are budgeted, yet no byte is lost: the rows that are written,
// with the rows written when the job ends, add up to the totals.
func TestReportBypassHostile(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	addJob(t, tb, "L", jobs.Ref{JobID: "42"}, jobA)
	to := func(string) string { return "10.20.0.5/32" }
	total := func() BypassStats {
		for _, b := range tb.Stats().Bypass {
			if b.Rule == "squid" {
				return b
			}
		}
		return BypassStats{}
	}
	var prev BypassStats
	for i := range 1000 {
		v := uint64(0)
		if i%2 == 1 {
			v = math.MaxUint64
		}
		tb.ReportBypass("L", []BypassStats{{Rule: "squid", Flows: v, BytesOut: v, BytesIn: v}}, to)
		got := total()
		if got.Flows < prev.Flows || got.BytesOut < prev.BytesOut || got.BytesIn < prev.BytesIn {
			t.Fatalf("report %d: totals went down from %+v to %+v (wrapped)", i, prev, got)
		}
		prev = got
	}
	if prev.BytesIn != math.MaxUint64 {
		t.Errorf("totals %+v, want saturated at 2^64-1", prev)
	}
	if n := len(ml.all()); n > 20 {
		t.Errorf("1000 reports wrote %d flow log rows, want a budget of about 10", n)
	}

	// An honest client that reports too often: capped and budgeted, but
	// every byte is in the totals and, once the job ends, in the log.
	ml2 := &memLog{}
	tb2 := New(Config{Log: ml2})
	addJob(t, tb2, "L2", jobs.Ref{JobID: "43"}, jobA)
	for i := 1; i <= 5000; i++ {
		tb2.ReportBypass("L2", []BypassStats{{Rule: "squid", Flows: uint64(i), BytesIn: uint64(10 * i)}}, to)
	}
	if n := len(ml2.all()); n > 20 {
		t.Errorf("5000 reports wrote %d flow log rows, want a budget of about 10", n)
	}
	tb2.CloseJob("L2", EndJob)
	tb2.RemoveJob("L2")
	var flows, in uint64
	for _, r := range ml2.all() {
		if r.Verdict == Bypassed {
			flows += r.Flows
			in += r.BytesIn
		}
	}
	if st := tb2.Stats().Bypass; len(st) != 1 || st[0].Flows != 5000 || st[0].BytesIn != 50000 {
		t.Errorf("totals %+v, want 5000 flows, 50000 bytes in", st)
	}
	if flows != 5000 || in != 50000 {
		t.Errorf("flow log rows add up to %d flows, %d bytes in; want 5000 and 50000", flows, in)
	}
}

// FuzzReportBypass drives one lease's bypass reports from arbitrary bytes
// (a client with a valid lease controls them completely: rule names among
// the job's entries, counters, how often). Each 25-byte step is an entry
// (one of three), three counters and a flag to advance the clock by a
// second. Invariants: the gateway's totals never go down and never wrap;
// the job's flow log rows stay within their budget (the burst and one per
// second of the fuzzer's clock, plus one per entry at the end); and once
// the job ends, its rows add up to the totals exactly.
func FuzzReportBypass(f *testing.F) {
	f.Add(make([]byte, 25*4))
	step := func(rule byte, a, b, c uint64, tick bool) []byte {
		out := []byte{rule}
		for _, v := range []uint64{a, b, c} {
			out = binary.BigEndian.AppendUint64(out, v)
		}
		if tick {
			out[0] |= 0x80
		}
		return out
	}
	var seed []byte
	for i, v := range []uint64{0, math.MaxUint64, 0, math.MaxUint64, 5, 4} {
		seed = append(seed, step(byte(i%3), v, v, v, i%2 == 0)...)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		ml := &memLog{}
		tb := New(Config{Log: ml})
		addJob(t, tb, "L", jobs.Ref{}, jobA)
		to := func(r string) string { return "10.20.0.0/16" }
		rules := []string{"squid", "xrootd", "cvmfs"}
		now := time.Unix(1_700_000_000, 0)
		prev := map[string]BypassStats{}
		seconds := 0
		for len(b) >= 25 {
			s := b[:25]
			b = b[25:]
			if s[0]&0x80 != 0 {
				now = now.Add(time.Second)
				seconds++
			}
			c := BypassStats{Rule: rules[int(s[0]&0x7f)%len(rules)], Flows: binary.BigEndian.Uint64(s[1:]),
				BytesOut: binary.BigEndian.Uint64(s[9:]), BytesIn: binary.BigEndian.Uint64(s[17:])}
			tb.reportBypassAt("L", []BypassStats{c}, to, now)
			for _, g := range tb.Stats().Bypass {
				p := prev[g.Rule]
				if g.Flows < p.Flows || g.BytesOut < p.BytesOut || g.BytesIn < p.BytesIn {
					t.Fatalf("totals of %s went down: %+v after %+v", g.Rule, g, p)
				}
				prev[g.Rule] = g
			}
		}
		if n, max := len(ml.all()), bypassRowBurst+seconds*int(bypassRowRate)+1; n > max {
			t.Fatalf("%d rows over %d s of reports, budget %d", n, seconds, max)
		}
		tb.CloseJob("L", EndJob)
		tb.RemoveJob("L")
		sum := map[string]BypassStats{}
		for _, r := range ml.all() {
			s := sum[r.Bypass]
			s.Flows, s.BytesOut, s.BytesIn = satAdd(s.Flows, r.Flows), satAdd(s.BytesOut, r.BytesOut), satAdd(s.BytesIn, r.BytesIn)
			sum[r.Bypass] = s
		}
		for _, g := range tb.Stats().Bypass {
			s := sum[g.Rule]
			if s.Flows != g.Flows || s.BytesOut != g.BytesOut || s.BytesIn != g.BytesIn {
				t.Fatalf("rows of %s add up to %+v, totals %+v", g.Rule, s, g)
			}
		}
	})
}
