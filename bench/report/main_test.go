// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/bench/record"
)

// writeRun writes a throughput file of mode with three repetitions of one
// point of two configurations, one of them flagged by the load gate and
// one discarded, and a latency file.
func writeRun(t *testing.T, mode string) string {
	dir := t.TempDir()
	path := filepath.Join(dir, "2026-11-24T100000Z.tsv")
	var b bytes.Buffer
	w := record.NewWriter(&b, record.Columns)
	for rep, mbps := range []float64{900, 950, 940} {
		for _, c := range []string{"airlock", "ocserv-dtls"} {
			r := record.Row{Date: "2026-11-24T10:00:00Z", Mode: mode, Config: c, Commit: "0123456789abcdef", Link: "1gbit",
				Streams: 1, Dir: "up", Duration: 10, Rep: rep + 1, Kept: true, Mbps: mbps, NativeMbps: 1000, GwCPU: 5, ClientCPU: -1}
			if c == "ocserv-dtls" {
				r.Mbps /= 2
				if rep == 1 {
					r.Note = "LOAD GATE GAVE UP: 1.50 busy cores before; "
				}
			}
			if err := w.Row(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	_ = w.Row(record.Row{Mode: mode, Config: "airlock", Link: "1gbit", Streams: 1, Dir: "up", Rep: 4, Kept: false, Mbps: 10, NativeMbps: 1000, Note: "DTLS FELL BACK"})
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	lw := record.NewWriter(&b, record.LatencyColumns)
	for rep := 1; rep <= 3; rep++ {
		_ = lw.Latency(record.Latency{Mode: mode, Config: "airlock", Link: "1gbit", Probe: "tcp-rr", Bulk: "down", Rep: rep, Kept: true,
			N: 500, P50: 0.5, P99: float64(rep) + 0.5, NativeP50: 0.1, NativeP99: 0.5, BulkMbps: 900})
	}
	if err := os.WriteFile(strings.TrimSuffix(path, ".tsv")+"-latency.tsv", b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReport(t *testing.T) {
	rep, err := load(writeRun(t, record.ModeFull))
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.quotable(); err != nil {
		t.Errorf("full run: %v", err)
	}
	got := rep.full(".")
	for _, want := range []string{
		"2026-11-24T100000Z.tsv",                                                            // says which file
		"3 repetitions", "2026-11-24T10:00:00Z to 2026-11-24T10:00:00Z; commit 0123456789;", // the method
		"0.94 [0.90–0.95]<br>0.94 [0.90–0.95]×",                           // airlock: median and range of Gbit/s and ratio
		"0.47 [0.45–0.47]",                                                // ocserv-dtls
		"(1 flagged)",                                                     // the load gate's give-up is visible
		"rep 4: not counted: DTLS FELL BACK",                              // the discarded row is named
		"| airlock | 1gbit | down | 0.40 | 2.00 [1.00–3.00] |",            // added latency
		"| airlock | every veth capped at 1gbit (tc tbf) | 0.532 | n/a |", // 5 s / 9.4 Gbit
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "NOT QUOTABLE") {
		t.Errorf("full run marked not quotable:\n%s", got)
	}
}

func TestReportRefusesQuick(t *testing.T) {
	for _, mode := range []string{record.ModeQuick, record.ModeSmoke} {
		rep, err := load(writeRun(t, mode))
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.quotable(); err == nil {
			t.Errorf("%s run: quotable", mode)
		}
		if !strings.Contains(rep.full("."), "NOT QUOTABLE") {
			t.Errorf("%s run: report not marked", mode)
		}
	}
}

func TestSplice(t *testing.T) {
	doc := []byte("a\n" + BeginMarker + "\nold\n" + EndMarker + "\nb\n")
	got, err := spliceText(doc, "new\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "a\n" + BeginMarker + "\nnew\n" + EndMarker + "\nb\n"
	if string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := spliceText([]byte("no markers"), "x"); err == nil {
		t.Error("no markers: got no error")
	}
}

// TestReplaced: -newer keeps an earlier run's rows only for the
// configurations and links the later run did not measure.
func TestReplaced(t *testing.T) {
	old := []record.Row{{Config: "airlock", Link: "uncapped", Mbps: 1}, {Config: "airlock", Link: "1gbit", Mbps: 2}, {Config: "ocserv", Link: "uncapped", Mbps: 3}}
	newer := []record.Row{{Config: "airlock", Link: "uncapped", Mbps: 4}}
	got := replaced(old, newer, func(x record.Row) [2]string { return [2]string{x.Config, x.Link} })
	if len(got) != 2 || got[0].Mbps != 2 || got[1].Mbps != 3 {
		t.Errorf("replaced = %+v, want the 1gbit airlock row and the ocserv row", got)
	}
}
