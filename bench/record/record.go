// SPDX-License-Identifier: MIT

// Package record is the raw-data format of a benchmark run: one TSV row
// per measurement, written by TestBench as it goes (so an interrupted run
// keeps what it measured) and read back by bench/report, which derives
// every table and plot from it.
//
// Two kinds of file share a run's stem: STEM.tsv holds throughput rows
// (Row), STEM-latency.tsv latency rows (Latency). Both start with a header
// line naming the columns; readers find columns by name, so a column added
// later does not break older files. A row's Mode is "full", "quick" or
// "smoke": only full rows may be quoted (bench/report refuses the others
// for the README).
package record

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Modes of a run.
const (
	ModeFull  = "full"
	ModeQuick = "quick"
	ModeSmoke = "smoke"
)

// Row is one throughput measurement: one iperf3 run of a configuration and
// the native run paired with it. CPU fields are CPU seconds (user+system)
// spent during the point, -1 when not applicable. Busy fields are cores
// busy on the whole machine (from /proc/stat); Load fields the 1-minute
// load average.
type Row struct {
	Date     string // RFC 3339, UTC, when the point started
	Mode     string // ModeFull, ModeQuick or ModeSmoke
	Config   string
	Commit   string
	Link     string // "1gbit", "uncapped", "1gbit+rtt40ms-loss0.1%"
	Streams  int
	Dir      string // "up" (job → outside) or "down" (iperf3 -R)
	Duration int    // iperf3 -t, seconds
	Rep      int
	Retries  int  // times the point was discarded (load gate) and repeated
	Kept     bool // false: discarded by the load gate (kept in the file as raw data)

	Mbps, NativeMbps float64

	GwCPU, ClientCPU         float64 // the configuration's daemons
	IperfCliCPU, IperfSrvCPU float64 // the iperf3 ends of the configuration's run
	NatIperfCli, NatIperfSrv float64 // the iperf3 ends of the native run
	IdleCPU                  float64 // the configuration's daemons in the window before the point
	LoadBefore, LoadDuring   float64
	BusyBefore, BusyDuring   float64
	Note                     string // errors, "load gate gave up", "not measured: …"
}

// Ratio is Mbps over NativeMbps (0 without a native figure).
func (r Row) Ratio() float64 {
	if r.NativeMbps <= 0 {
		return 0
	}
	return r.Mbps / r.NativeMbps
}

// Valid reports whether the row is a measurement to aggregate: kept by the
// load gate, with both figures.
func (r Row) Valid() bool { return r.Kept && r.Mbps > 0 && r.NativeMbps > 0 }

// Columns is the header of a throughput file.
var Columns = []string{"date", "mode", "config", "commit", "streams", "direction", "link", "duration_s",
	"mbps", "native_mbps", "ratio", "gw_cpu_s", "client_cpu_s", "iperf_client_cpu_s", "iperf_server_cpu_s",
	"native_iperf_client_cpu_s", "native_iperf_server_cpu_s", "idle_cpu_s", "load1_before", "load1_during",
	"busy_cores_before", "busy_cores_during", "rep", "retries", "kept", "note"}

func (r Row) fields() []string {
	return []string{r.Date, r.Mode, r.Config, r.Commit, strconv.Itoa(r.Streams), r.Dir, r.Link, strconv.Itoa(r.Duration),
		f1(r.Mbps), f1(r.NativeMbps), f4(r.Ratio()), cpu(r.GwCPU), cpu(r.ClientCPU), cpu(r.IperfCliCPU), cpu(r.IperfSrvCPU),
		cpu(r.NatIperfCli), cpu(r.NatIperfSrv), cpu(r.IdleCPU), f2(r.LoadBefore), f2(r.LoadDuring),
		f2(r.BusyBefore), f2(r.BusyDuring), strconv.Itoa(r.Rep), strconv.Itoa(r.Retries), strconv.FormatBool(r.Kept), clean(r.Note)}
}

// Latency is one latency measurement: a probe's round trips through a
// configuration, with or without a bulk transfer in a second job, and the
// same probe over native routing right after it. Times in milliseconds.
type Latency struct {
	Date, Mode, Config, Commit, Link string
	Probe                            string // "tcp-rr" or "ping"
	Bulk                             string // "idle", "down" or "up": the second job's bulk transfer
	Rep, Retries                     int
	Kept                             bool
	N                                int // round trips counted
	P50, P99, NativeP50, NativeP99   float64
	BulkMbps                         float64 // the second job's bulk throughput during the probe
	LoadBefore, BusyBefore           float64
	Note                             string
}

// LatencyColumns is the header of a latency file.
var LatencyColumns = []string{"date", "mode", "config", "commit", "link", "probe", "bulk", "n",
	"p50_ms", "p99_ms", "native_p50_ms", "native_p99_ms", "added_p50_ms", "added_p99_ms", "bulk_mbps",
	"load1_before", "busy_cores_before", "rep", "retries", "kept", "note"}

func (l Latency) fields() []string {
	return []string{l.Date, l.Mode, l.Config, l.Commit, l.Link, l.Probe, l.Bulk, strconv.Itoa(l.N),
		f3(l.P50), f3(l.P99), f3(l.NativeP50), f3(l.NativeP99), f3(l.P50 - l.NativeP50), f3(l.P99 - l.NativeP99), f1(l.BulkMbps),
		f2(l.LoadBefore), f2(l.BusyBefore), strconv.Itoa(l.Rep), strconv.Itoa(l.Retries), strconv.FormatBool(l.Kept), clean(l.Note)}
}

// Valid reports whether the row is a measurement to aggregate.
func (l Latency) Valid() bool { return l.Kept && l.N > 0 && l.NativeP50 > 0 }

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
func f3(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
func f4(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }

func cpu(v float64) string {
	if v < 0 {
		return "-"
	}
	return f2(v)
}

// clean makes free text one TSV field: no tabs, no line breaks, no control
// characters, at most 400 bytes.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' || r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 400 {
		s = s[:400] + "…"
	}
	return s
}

// Writer appends rows to a file; each row is written at once. Not safe for
// concurrent use.
type Writer struct {
	w   io.Writer
	err error
}

// NewWriter writes the header of cols to w and returns a Writer.
func NewWriter(w io.Writer, cols []string) *Writer {
	rw := &Writer{w: w}
	_, rw.err = io.WriteString(w, strings.Join(cols, "\t")+"\n")
	return rw
}

// Row writes one throughput row.
func (w *Writer) Row(r Row) error { return w.line(r.fields()) }

// Latency writes one latency row.
func (w *Writer) Latency(l Latency) error { return w.line(l.fields()) }

func (w *Writer) line(f []string) error {
	if w.err != nil {
		return w.err
	}
	_, w.err = io.WriteString(w.w, strings.Join(f, "\t")+"\n")
	return w.err
}

// table is a parsed TSV: the header's column indices and the rows.
type table struct {
	idx  map[string]int
	rows [][]string
}

func readTable(r io.Reader, need []string) (*table, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() {
		return nil, fmt.Errorf("read header: %w", orEOF(sc.Err()))
	}
	t := &table{idx: map[string]int{}}
	for i, c := range strings.Split(sc.Text(), "\t") {
		t.idx[c] = i
	}
	for _, c := range need {
		if _, ok := t.idx[c]; !ok {
			return nil, fmt.Errorf("header: no column %q", c)
		}
	}
	line := 1
	for sc.Scan() {
		line++
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		f := strings.Split(sc.Text(), "\t")
		if len(f) != len(t.idx) {
			return nil, fmt.Errorf("line %d: %d fields, header has %d", line, len(f), len(t.idx))
		}
		t.rows = append(t.rows, f)
	}
	return t, sc.Err()
}

func orEOF(err error) error {
	if err == nil {
		return io.ErrUnexpectedEOF
	}
	return err
}

// rowReader reads typed fields of one row, remembering the first error.
type rowReader struct {
	t    *table
	cell []string
	line int
	err  error
}

func (p *rowReader) s(col string) string {
	i, ok := p.t.idx[col]
	if !ok {
		return ""
	}
	return p.cell[i]
}

func (p *rowReader) i(col string) int {
	v, err := strconv.Atoi(p.s(col))
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("line %d: %s: %w", p.line, col, err)
	}
	return v
}

func (p *rowReader) f(col string) float64 {
	s := p.s(col)
	if s == "-" || s == "" {
		return -1
	}
	v, err := strconv.ParseFloat(s, 64)
	if (err != nil || math.IsNaN(v) || math.IsInf(v, 0)) && p.err == nil {
		p.err = fmt.Errorf("line %d: %s: bad number %q", p.line, col, s)
	}
	return v
}

func (p *rowReader) b(col string) bool {
	v, err := strconv.ParseBool(p.s(col))
	if err != nil && p.err == nil {
		p.err = fmt.Errorf("line %d: %s: %w", p.line, col, err)
	}
	return v
}

func (p *rowReader) mode() string {
	m := p.s("mode")
	if m != ModeFull && m != ModeQuick && m != ModeSmoke && p.err == nil {
		p.err = fmt.Errorf("line %d: mode %q: want full, quick or smoke", p.line, m)
	}
	return m
}

// Read parses a throughput file.
func Read(r io.Reader) ([]Row, error) {
	t, err := readTable(r, []string{"mode", "config", "streams", "direction", "link", "mbps", "native_mbps", "rep", "kept"})
	if err != nil {
		return nil, err
	}
	var out []Row
	for n, f := range t.rows {
		p := &rowReader{t: t, cell: f, line: n + 2}
		out = append(out, Row{
			Date: p.s("date"), Mode: p.mode(), Config: p.s("config"), Commit: p.s("commit"), Link: p.s("link"),
			Streams: p.i("streams"), Dir: p.s("direction"), Duration: p.i("duration_s"), Rep: p.i("rep"),
			Retries: p.i("retries"), Kept: p.b("kept"), Mbps: p.f("mbps"), NativeMbps: p.f("native_mbps"),
			GwCPU: p.f("gw_cpu_s"), ClientCPU: p.f("client_cpu_s"), IperfCliCPU: p.f("iperf_client_cpu_s"),
			IperfSrvCPU: p.f("iperf_server_cpu_s"), NatIperfCli: p.f("native_iperf_client_cpu_s"),
			NatIperfSrv: p.f("native_iperf_server_cpu_s"), IdleCPU: p.f("idle_cpu_s"),
			LoadBefore: p.f("load1_before"), LoadDuring: p.f("load1_during"),
			BusyBefore: p.f("busy_cores_before"), BusyDuring: p.f("busy_cores_during"), Note: p.s("note"),
		})
		if p.err != nil {
			return nil, p.err
		}
	}
	return out, nil
}

// ReadLatency parses a latency file.
func ReadLatency(r io.Reader) ([]Latency, error) {
	t, err := readTable(r, []string{"mode", "config", "link", "probe", "bulk", "n", "p50_ms", "p99_ms", "native_p50_ms", "native_p99_ms", "kept"})
	if err != nil {
		return nil, err
	}
	var out []Latency
	for n, f := range t.rows {
		p := &rowReader{t: t, cell: f, line: n + 2}
		out = append(out, Latency{
			Date: p.s("date"), Mode: p.mode(), Config: p.s("config"), Commit: p.s("commit"), Link: p.s("link"),
			Probe: p.s("probe"), Bulk: p.s("bulk"), N: p.i("n"), P50: p.f("p50_ms"), P99: p.f("p99_ms"),
			NativeP50: p.f("native_p50_ms"), NativeP99: p.f("native_p99_ms"), BulkMbps: p.f("bulk_mbps"),
			LoadBefore: p.f("load1_before"), BusyBefore: p.f("busy_cores_before"), Rep: p.i("rep"),
			Retries: p.i("retries"), Kept: p.b("kept"), Note: p.s("note"),
		})
		if p.err != nil {
			return nil, p.err
		}
	}
	return out, nil
}
