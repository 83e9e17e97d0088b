// SPDX-License-Identifier: MIT

package record

import (
	"bytes"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	in := Row{Date: "2026-11-23T14:00:00Z", Mode: ModeFull, Config: "ocserv-dtls", Commit: "abc", Link: "1gbit",
		Streams: 10, Dir: "down", Duration: 10, Rep: 2, Retries: 1, Kept: true, Mbps: 512.3, NativeMbps: 960,
		GwCPU: 1.5, ClientCPU: -1, IperfCliCPU: 0.5, IperfSrvCPU: 0.25, NatIperfCli: 0.5, NatIperfSrv: 0.5,
		IdleCPU: 0, LoadBefore: 0.12, LoadDuring: 1.5, BusyBefore: 0.05, BusyDuring: 1.9, Note: "a\tb\nc"}
	var b bytes.Buffer
	w := NewWriter(&b, Columns)
	if err := w.Row(in); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("got %d rows, want 1", len(got))
	}
	want := in
	want.Note = "a b c"
	if got[0] != want {
		t.Errorf("got %+v, want %+v", got[0], want)
	}
	if r := got[0].Ratio(); r < 0.533 || r > 0.534 {
		t.Errorf("ratio %v, want 0.5336", r)
	}
}

func TestLatencyRoundTrip(t *testing.T) {
	in := Latency{Date: "d", Mode: ModeSmoke, Config: "airlock", Commit: "c", Link: "uncapped", Probe: "tcp-rr",
		Bulk: "down", Rep: 1, Kept: true, N: 100, P50: 0.25, P99: 3.5, NativeP50: 0.05, NativeP99: 0.2, BulkMbps: 1500,
		LoadBefore: 0.1, BusyBefore: 0.2}
	var b bytes.Buffer
	w := NewWriter(&b, LatencyColumns)
	if err := w.Latency(in); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "\t3.300\t") {
		t.Errorf("no added p99 3.300 in %q", b.String())
	}
	got, err := ReadLatency(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != in {
		t.Errorf("got %+v, want %+v", got, in)
	}
}

func TestReadRejects(t *testing.T) {
	hdr := strings.Join(Columns, "\t") + "\n"
	row := func(mode, mbps string) string {
		f := make([]string, len(Columns))
		for i, c := range Columns {
			switch c {
			case "mode":
				f[i] = mode
			case "mbps":
				f[i] = mbps
			case "kept":
				f[i] = "true"
			case "streams", "rep", "retries", "duration_s":
				f[i] = "1"
			default:
				f[i] = "0"
			}
		}
		return strings.Join(f, "\t") + "\n"
	}
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"missing column", "date\tmode\n"},
		{"bad mode", hdr + row("fast", "1")},
		{"bad number", hdr + row("full", "x")},
		{"NaN", hdr + row("full", "NaN")},
		{"short row", hdr + "a\tb\n"},
	} {
		if _, err := Read(strings.NewReader(tc.in)); err == nil {
			t.Errorf("%s: got no error", tc.name)
		}
	}
	if _, err := Read(strings.NewReader(hdr + row("full", "1"))); err != nil {
		t.Errorf("valid row: %v", err)
	}
}

func TestStats(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if got := Median(xs); got != 3 {
		t.Errorf("median: got %v, want 3", got)
	}
	if got := Median(xs[:4]); got != 3 {
		t.Errorf("median of 5 1 4 2: got %v, want 3", got)
	}
	if lo, hi := Range(xs); lo != 1 || hi != 5 {
		t.Errorf("range: got %v–%v, want 1–5", lo, hi)
	}
	var h []float64
	for i := 1; i <= 100; i++ {
		h = append(h, float64(i))
	}
	for _, tc := range []struct{ p, want float64 }{{50, 50}, {99, 99}, {100, 100}, {1, 1}} {
		if got := Percentile(h, tc.p); got != tc.want {
			t.Errorf("p%v: got %v, want %v", tc.p, got, tc.want)
		}
	}
	if Median(nil) != 0 || Percentile(nil, 50) != 0 {
		t.Error("empty input: want 0")
	}
}
