package flows

import (
	"net/netip"
	"testing"
)

// TestReportBypass checks that a client's cumulative bypass counts become
// per-job counts, gateway totals by rule and one flow log row per rule
// that grew, with the increase since the previous report.
func TestReportBypass(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	job := netip.MustParseAddr("100.64.0.2")
	tb.AddJob(job, JobRef{Lease: "L", JobID: "42", Token: "cms"})
	to := func(string) string { return "10.20.0.5/32" }

	tb.ReportBypass(job, []BypassStats{{Rule: "squid", Flows: 2, BytesOut: 100, BytesIn: 5000}}, to)
	tb.ReportBypass(job, []BypassStats{{Rule: "squid", Flows: 2, BytesOut: 100, BytesIn: 5000}}, to) // no change: no row
	tb.ReportBypass(job, []BypassStats{{Rule: "squid", Flows: 3, BytesOut: 150, BytesIn: 9000}, {Rule: "xrootd", Flows: 1, BytesIn: 7}}, to)
	tb.ReportBypass(netip.MustParseAddr("100.64.0.9"), []BypassStats{{Rule: "squid", Flows: 99}}, to) // unknown job

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
	// A client that starts over (counts went down) adds what it reports.
	tb.ReportBypass(job, []BypassStats{{Rule: "squid", Flows: 1, BytesIn: 10}}, to)
	if got := tb.Stats().Bypass[0]; got.Flows != 4 || got.BytesIn != 9010 {
		t.Errorf("after a restart: %+v, want 4 flows, 9010 in", got)
	}
}
