// SPDX-License-Identifier: MIT

// Command report derives the benchmark's tables and plots from the raw TSV
// of one run (bench/record), so that every published figure can be
// re-derived from committed data:
//
//	go run ./bench/report -in bench/results/STAMP.tsv -md /tmp/table.md
//	go run ./bench/report -in bench/results/STAMP.tsv \
//	    -docs docs/benchmarks.md -plots docs
//
// It reads STAMP.tsv (throughput) and, if present, STAMP-latency.tsv. Per
// point (configuration, link, streams, direction) it reports the median
// and the range over the repetitions; rows the load gate discarded are
// left out, rows it let through after giving up are counted and named.
// -readme and -docs replace the text between the markers
// "<!-- bench-report:begin -->" and "<!-- bench-report:end -->" in those
// files; they refuse a run whose rows are not all mode "full" (quick and
// smoke runs are for development and are never quoted). -plots draws
// benchmarks-throughput.png and benchmarks-ratio.png with gnuplot
// (bench/plot.gp) from a summary TSV written next to the input.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/airlock-vpn/airlock/bench/record"
)

// Markers delimit the generated text in docs/benchmarks.md (and in any
// file given to -readme).
const (
	BeginMarker = "<!-- bench-report:begin -->"
	EndMarker   = "<!-- bench-report:end -->"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
}

func run() error {
	in := flag.String("in", "", "throughput TSV of a run (bench/results/STAMP.tsv), or several, comma-separated, read as one run (e.g. the uncapped and the 1 Gbit halves of the full run, measured separately)")
	md := flag.String("md", "", "write the full report (markdown) to this file; any mode")
	readme := flag.String("readme", "", "README.md to update between the markers (full runs only)")
	docs := flag.String("docs", "", "docs/benchmarks.md to update between the markers (full runs only)")
	plots := flag.String("plots", "", "directory for the PNG plots (needs gnuplot)")
	plot := flag.String("gp", "", "gnuplot script (default: plot.gp next to this command's source, bench/plot.gp)")
	newer := flag.Bool("newer", false, "with several -in files: a later file's rows replace the earlier files' rows of the same configuration and link (a run of some configurations on top of a full run)")
	flag.Parse()
	if *in == "" {
		return errors.New("-in is required")
	}
	paths := strings.Split(*in, ",")
	var rep *report
	for _, path := range paths {
		r, err := load(path)
		if err != nil {
			return err
		}
		if rep == nil {
			rep = r
			continue
		}
		rep.name += "," + r.name
		if *newer {
			rep.rows = replaced(rep.rows, r.rows, func(x record.Row) [2]string { return [2]string{x.Config, x.Link} })
			rep.lat = replaced(rep.lat, r.lat, func(x record.Latency) [2]string { return [2]string{x.Config, x.Link} })
		}
		rep.rows = append(rep.rows, r.rows...)
		rep.lat = append(rep.lat, r.lat...)
	}
	if *md != "" {
		if err := os.WriteFile(*md, []byte(rep.full(filepath.Dir(*md))), 0o644); err != nil {
			return err
		}
	}
	if *readme != "" || *docs != "" {
		if err := rep.quotable(); err != nil {
			return err
		}
	}
	if *readme != "" {
		if err := splice(*readme, rep.readme(filepath.Dir(*readme))); err != nil {
			return err
		}
	}
	if *docs != "" {
		if err := splice(*docs, rep.full(filepath.Dir(*docs))); err != nil {
			return err
		}
	}
	if *plots != "" {
		gp := *plot
		if gp == "" {
			gp = filepath.Join(filepath.Dir(filepath.Dir(paths[0])), "plot.gp")
			if _, err := os.Stat(gp); err != nil {
				gp = filepath.Join("bench", "plot.gp")
			}
		}
		if err := rep.plot(paths[0], gp, *plots); err != nil {
			return err
		}
	}
	return nil
}

// replaced returns old without the rows whose key (configuration, link)
// a row of newer has.
func replaced[T any](old, newer []T, key func(T) [2]string) []T {
	in := map[[2]string]bool{}
	for _, x := range newer {
		in[key(x)] = true
	}
	var out []T
	for _, x := range old {
		if !in[key(x)] {
			out = append(out, x)
		}
	}
	return out
}

// report is one run's rows.
type report struct {
	name string // the input files, as given, comma-separated
	rows []record.Row
	lat  []record.Latency
}

func load(path string) (*report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := record.Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r := &report{name: path, rows: rows}
	lp := strings.TrimSuffix(path, ".tsv") + "-latency.tsv"
	if lf, err := os.Open(lp); err == nil {
		defer lf.Close()
		if r.lat, err = record.ReadLatency(lf); err != nil {
			return nil, fmt.Errorf("%s: %w", lp, err)
		}
	}
	if len(r.rows) == 0 && len(r.lat) == 0 {
		return nil, fmt.Errorf("%s: no rows", path)
	}
	return r, nil
}

// quotable returns an error unless every row is from a full run.
func (r *report) quotable() error {
	modes := map[string]int{}
	for _, x := range r.rows {
		modes[x.Mode]++
	}
	for _, x := range r.lat {
		modes[x.Mode]++
	}
	for m, n := range modes {
		if m != record.ModeFull {
			return fmt.Errorf("%s: %d rows are from a %s run; only full runs (bench/run.sh without --quick or --smoke) may be quoted", r.name, n, m)
		}
	}
	return nil
}

// point is the repetitions of one (config, link, streams, direction).
type point struct {
	config, link, dir string
	streams           int
	mbps, ratio       []float64
	gwPerGbit         []float64 // CPU seconds per transferred Gbit
	cliPerGbit        []float64
	flagged           int // run although the load gate gave up
}

func (r *report) points() []*point {
	type key struct {
		c, l, d string
		s       int
	}
	m := map[key]*point{}
	var out []*point
	for _, x := range r.rows {
		if !x.Valid() {
			continue
		}
		k := key{x.Config, x.Link, x.Dir, x.Streams}
		p := m[k]
		if p == nil {
			p = &point{config: x.Config, link: x.Link, dir: x.Dir, streams: x.Streams}
			m[k] = p
			out = append(out, p)
		}
		p.mbps = append(p.mbps, x.Mbps)
		p.ratio = append(p.ratio, x.Ratio())
		gbit := x.Mbps * float64(x.Duration) / 1000
		if x.GwCPU >= 0 && gbit > 0 {
			p.gwPerGbit = append(p.gwPerGbit, x.GwCPU/gbit)
		}
		if x.ClientCPU >= 0 && gbit > 0 {
			p.cliPerGbit = append(p.cliPerGbit, x.ClientCPU/gbit)
		}
		if strings.Contains(x.Note, "LOAD GATE GAVE UP") {
			p.flagged++
		}
	}
	return out
}

func nonEmpty(xs []string) []string {
	var out []string
	for _, x := range xs {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}

func uniq(xs []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// header is the run's provenance line, with a link to the input relative
// to the directory of the document it goes into.
func (r *report) header(docDir string) string {
	var dates, commits, modes []string
	reps, dur := 0, 0
	for _, x := range r.rows {
		modes = append(modes, x.Mode)
		if !x.Valid() {
			continue
		}
		dates, commits = append(dates, x.Date), append(commits, x.Commit)
		if x.Rep > reps {
			reps = x.Rep
		}
		if x.Duration > dur {
			dur = x.Duration
		}
	}
	for _, x := range r.lat {
		modes = append(modes, x.Mode)
		if x.Valid() {
			dates, commits = append(dates, x.Date), append(commits, x.Commit)
		}
	}
	dates, commits = nonEmpty(dates), nonEmpty(commits)
	sort.Strings(dates)
	first, last := "", ""
	if len(dates) > 0 {
		first, last = dates[0], dates[len(dates)-1]
	}
	short := uniq(commits)
	for i, c := range short {
		if len(c) > 10 {
			short[i] = c[:10]
		}
	}
	var files []string
	for _, name := range strings.Split(r.name, ",") {
		link := name
		if abs, err := filepath.Abs(name); err == nil {
			if d, err := filepath.Abs(docDir); err == nil {
				if rel, err := filepath.Rel(d, abs); err == nil {
					link = rel
				}
			}
		}
		files = append(files, fmt.Sprintf("[`%s`](%s)", filepath.Base(name), filepath.ToSlash(link)))
	}
	s := fmt.Sprintf("Generated by `go run ./bench/report` from %s (%s to %s; commit %s; iperf3 `-t %d`, %d repetitions interleaved across configurations, each paired with a native run; median and [min–max] over the repetitions).\n",
		strings.Join(files, " and "), first, last, strings.Join(short, ", "), dur, reps)
	if m := uniq(modes); len(m) != 1 || m[0] != record.ModeFull {
		s = fmt.Sprintf("**%s RUN — NOT QUOTABLE** (mode %s: a development check of the method, not a measurement).\n\n", strings.ToUpper(strings.Join(m, "/")), strings.Join(m, ", ")) + s
	}
	return s
}

func dirName(d string) string {
	if d == "down" {
		return "outside → job"
	}
	return "job → outside"
}

func span(xs []float64, f string) string {
	lo, hi := record.Range(xs)
	if lo == hi {
		return fmt.Sprintf(f, record.Median(xs))
	}
	return fmt.Sprintf(f+" ["+f+"–"+f+"]", record.Median(xs), lo, hi)
}

// throughputTables is one table per link: Gbit/s and ratio per config.
func (r *report) throughputTables(configs []string) string {
	pts := r.points()
	var b strings.Builder
	links := []string{}
	for _, p := range pts {
		links = append(links, p.link)
	}
	for _, link := range uniq(links) {
		fmt.Fprintf(&b, "\n**%s** — received Gbit/s, median [min–max]; below it the ratio to the paired native run\n\n", linkName(link))
		var cols []string
		for _, c := range configs {
			for _, p := range pts {
				if p.link == link && p.config == c {
					cols = append(cols, c)
					break
				}
			}
		}
		b.WriteString("| streams | direction |")
		for _, c := range cols {
			fmt.Fprintf(&b, " %s |", c)
		}
		b.WriteString("\n|---|---|" + strings.Repeat("---|", len(cols)) + "\n")
		type sd struct {
			s int
			d string
		}
		var keys []sd
		seen := map[sd]bool{}
		for _, p := range pts {
			if k := (sd{p.streams, p.dir}); p.link == link && !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
		sort.SliceStable(keys, func(i, j int) bool {
			if keys[i].s != keys[j].s {
				return keys[i].s < keys[j].s
			}
			return keys[i].d > keys[j].d
		})
		for _, k := range keys {
			fmt.Fprintf(&b, "| %d | %s |", k.s, dirName(k.d))
			for _, c := range cols {
				cell := "—"
				for _, p := range pts {
					if p.link == link && p.config == c && p.streams == k.s && p.dir == k.d {
						g := make([]float64, len(p.mbps))
						for i, v := range p.mbps {
							g[i] = v / 1000
						}
						cell = span(g, "%.2f") + "<br>" + span(p.ratio, "%.2f") + "×"
						if p.flagged > 0 {
							cell += fmt.Sprintf(" (%d flagged)", p.flagged)
						}
					}
				}
				fmt.Fprintf(&b, " %s |", cell)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// cpuTable is the median gateway and client CPU seconds per Gbit.
func (r *report) cpuTable(configs []string) string {
	var b strings.Builder
	b.WriteString("\n**CPU seconds per transferred Gbit** (median over every run of a configuration on a link; daemons only: kernel forwarding and NAT are in no process)\n\n| config | link | gateway | client |\n|---|---|---|---|\n")
	pts := r.points()
	var links []string
	for _, p := range pts {
		links = append(links, p.link)
	}
	for _, link := range uniq(links) {
		for _, c := range configs {
			var gw, cli []float64
			found := false
			for _, p := range pts {
				if p.link == link && p.config == c {
					found = true
					gw, cli = append(gw, p.gwPerGbit...), append(cli, p.cliPerGbit...)
				}
			}
			if !found {
				continue
			}
			f := func(xs []float64) string {
				if len(xs) == 0 {
					return "n/a"
				}
				return fmt.Sprintf("%.3f", record.Median(xs))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c, linkName(link), f(gw), f(cli))
		}
	}
	return b.String()
}

// latencyTable is added p50/p99 per config, link, bulk and probe.
func (r *report) latencyTable() string {
	if len(r.lat) == 0 {
		return ""
	}
	type key struct{ c, l, bulk, probe string }
	m := map[key][]record.Latency{}
	var keys []key
	var notes []string
	gate := &flagged{}
	for _, x := range r.lat {
		if !x.Valid() {
			if x.Note != "" {
				notes = append(notes, fmt.Sprintf("%s %s %s %s rep %d: %s", x.Config, x.Link, x.Probe, x.Bulk, x.Rep, x.Note))
			}
			continue
		}
		if strings.Contains(x.Note, "LOAD GATE GAVE UP") {
			gate.add(x.Config, x.BusyBefore)
		}
		k := key{x.Config, x.Link, x.Bulk, x.Probe}
		if m[k] == nil {
			keys = append(keys, k)
		}
		m[k] = append(m[k], x)
	}
	var b strings.Builder
	b.WriteString("\n**Latency added by the tunnel** — round trip through the configuration minus the paired native run, ms, median [min–max] over repetitions; bulk: iperf3 in a second job at the same time (down: `-R`)\n\n")
	b.WriteString("| config | link | bulk | TCP request/response p50 | p99 | ping p50 | p99 | bulk Gbit/s | native p99 (rr) |\n|---|---|---|---|---|---|---|---|---|\n")
	type row struct{ c, l, bulk string }
	var rows []row
	seen := map[row]bool{}
	for _, k := range keys {
		if rk := (row{k.c, k.l, k.bulk}); !seen[rk] {
			seen[rk] = true
			rows = append(rows, rk)
		}
	}
	for _, rk := range rows {
		cell := func(probe string, p99 bool) string {
			xs := m[key{rk.c, rk.l, rk.bulk, probe}]
			if len(xs) == 0 {
				return "—"
			}
			var v []float64
			for _, x := range xs {
				if p99 {
					v = append(v, x.P99-x.NativeP99)
				} else {
					v = append(v, x.P50-x.NativeP50)
				}
			}
			return span(v, "%.2f")
		}
		var bulk, nat []float64
		for _, x := range m[key{rk.c, rk.l, rk.bulk, "tcp-rr"}] {
			bulk, nat = append(bulk, x.BulkMbps/1000), append(nat, x.NativeP99)
		}
		bs := "—"
		if rk.bulk != "idle" && len(bulk) > 0 {
			bs = fmt.Sprintf("%.2f", record.Median(bulk))
		}
		ns := "—"
		if len(nat) > 0 {
			ns = fmt.Sprintf("%.2f", record.Median(nat))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rk.c, rk.l, rk.bulk,
			cell("tcp-rr", false), cell("tcp-rr", true), cell("ping", false), cell("ping", true), bs, ns)
	}
	notes = append(notes, gate.lines("latency rows")...)
	if len(notes) > 0 {
		b.WriteString("\nLatency rows not counted or flagged:\n\n")
		for _, n := range notes {
			b.WriteString("- " + escape(n) + "\n")
		}
	}
	return b.String()
}

// flagged counts, per configuration, the rows the load gate let through
// after giving up, and the busy cores before them.
type flagged struct {
	order []string
	busy  map[string][]float64
}

func (f *flagged) add(config string, busy float64) {
	if f.busy == nil {
		f.busy = map[string][]float64{}
	}
	if _, ok := f.busy[config]; !ok {
		f.order = append(f.order, config)
	}
	f.busy[config] = append(f.busy[config], busy)
}

func (f *flagged) lines(what string) []string {
	var out []string
	for _, c := range f.order {
		lo, hi := record.Range(f.busy[c])
		out = append(out, fmt.Sprintf("%s: %d %s counted although the load gate gave up (%.2f–%.2f busy cores before)", c, len(f.busy[c]), what, lo, hi))
	}
	return out
}

// problems lists rows not measured or discarded, and counts the flagged.
func (r *report) problems() string {
	var b strings.Builder
	gate := &flagged{}
	for _, x := range r.rows {
		switch {
		case strings.HasPrefix(x.Note, "not measured"):
			fmt.Fprintf(&b, "- %s, %s: %s\n", x.Config, x.Link, escape(x.Note))
		case !x.Kept || x.Mbps <= 0 || x.NativeMbps <= 0:
			fmt.Fprintf(&b, "- %s %s P%d %s rep %d: not counted: %s\n", x.Config, x.Link, x.Streams, x.Dir, x.Rep, escape(x.Note))
		case strings.Contains(x.Note, "LOAD GATE GAVE UP"):
			gate.add(x.Config, x.BusyBefore)
		}
	}
	for _, l := range gate.lines("points") {
		b.WriteString("- " + l + "\n")
	}
	if b.Len() == 0 {
		return ""
	}
	return "\nNot counted or flagged:\n\n" + b.String()
}

// escape keeps table text from breaking the markdown.
func escape(s string) string {
	return strings.NewReplacer("|", "\\|", "<", "&lt;", ">", "&gt;", "`", "'").Replace(s)
}

func (r *report) configs() []string {
	var c []string
	for _, x := range r.rows {
		c = append(c, x.Config)
	}
	return uniq(c)
}

// full is the whole report (provenance, throughput, CPU, latency,
// problems) for a document in docDir.
func (r *report) full(docDir string) string {
	var b strings.Builder
	b.WriteString(r.header(docDir))
	b.WriteString(r.throughputTables(r.configs()))
	b.WriteString(r.cpuTable(r.configs()))
	b.WriteString(r.latencyTable())
	b.WriteString(r.problems())
	return b.String()
}

// readme is the README's part: provenance, the throughput tables and the
// latency table.
func (r *report) readme(docDir string) string {
	return r.header(docDir) + r.throughputTables(r.configs()) + r.latencyTable() + r.problems()
}

func linkName(l string) string {
	if l == "uncapped" {
		return "uncapped veth"
	}
	rate, wan, ok := strings.Cut(l, "+")
	if ok {
		return "every veth capped at " + rate + " (tc tbf), impairment relay " + wan
	}
	return "every veth capped at " + l + " (tc tbf)"
}

// splice replaces the text between the markers in path with text.
func splice(path, text string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := spliceText(b, text)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

func spliceText(doc []byte, text string) ([]byte, error) {
	i := bytes.Index(doc, []byte(BeginMarker))
	j := bytes.Index(doc, []byte(EndMarker))
	if i < 0 || j < i {
		return nil, fmt.Errorf("no %s … %s markers", BeginMarker, EndMarker)
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(BeginMarker)])
	out.WriteString("\n" + strings.TrimSpace(text) + "\n")
	out.Write(doc[j:])
	return out.Bytes(), nil
}

// plot writes the medians in summary form (the columns bench/plot.gp
// reads) next to in and runs gnuplot.
func (r *report) plot(in, gp, dir string) error {
	var s strings.Builder
	s.WriteString("config\tlink\tdirection\tstreams\tgbps\tnative_gbps\tratio\tgbps_min\tgbps_max\tratio_min\tratio_max\treps\n")
	for _, p := range r.points() {
		lo, hi := record.Range(p.mbps)
		rlo, rhi := record.Range(p.ratio)
		m := record.Median(p.mbps)
		nat := 0.0
		if rm := record.Median(p.ratio); rm > 0 {
			nat = m / rm
		}
		fmt.Fprintf(&s, "%s\t%s\t%s\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%d\n", p.config, p.link, p.dir, p.streams,
			m/1000, nat/1000, record.Median(p.ratio), lo/1000, hi/1000, rlo, rhi, len(p.mbps))
	}
	sum := strings.TrimSuffix(in, ".tsv") + "-summary.tsv"
	if err := os.WriteFile(sum, []byte(s.String()), 0o644); err != nil {
		return err
	}
	cmd := exec.Command("gnuplot", "-e", fmt.Sprintf("summary='%s'; outdir='%s'", sum, dir), gp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gnuplot %s: %v: %s", gp, err, out)
	}
	return nil
}
