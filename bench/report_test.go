package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// tsvWriter writes runs.tsv, one line per iperf3 run, flushed as it goes so
// that an interrupted benchmark keeps what it measured.
type tsvWriter struct {
	t *testing.T
	f *os.File
}

const tsvHeader = "config\tlink\tstreams\tdirection\trep\tgbps\tnative_gbps\tratio\tgw_cpu_s_per_gbit\tclient_cpu_s_per_gbit\tnote\n"

func newTSV(t *testing.T, path string) *tsvWriter {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(tsvHeader); err != nil {
		t.Fatal(err)
	}
	return &tsvWriter{t: t, f: f}
}

func (w *tsvWriter) write(r row) {
	_, err := fmt.Fprintf(w.f, "%s\t%s\t%d\t%s\t%d\t%.4f\t%.4f\t%.4f\t%s\t%s\t%s\n",
		r.Config, r.Link, r.Streams, r.Dir, r.Rep, r.Gbps, r.Native, r.ratio(), cpuStr(r.GwCPU), cpuStr(r.CliCPU), r.Note)
	if err != nil {
		w.t.Error(err)
	}
}

func (w *tsvWriter) close() {
	if err := w.f.Close(); err != nil {
		w.t.Error(err)
	}
}

func cpuStr(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.4f", v)
}

// agg is the medians over repetitions of one (config, link, streams, dir).
type agg struct {
	config, link, dir   string
	streams             int
	gbps, native, ratio float64
	gw, cli             float64 // -1: n/a
	n                   int
}

func aggregate(rows []row) []agg {
	type key struct {
		c, l, d string
		s       int
	}
	groups := map[key][]row{}
	var order []key
	for _, r := range rows {
		if r.Gbps <= 0 {
			continue
		}
		k := key{r.Config, r.Link, r.Dir, r.Streams}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []agg
	for _, k := range order {
		var g, n, ra, gw, cli []float64
		for _, r := range groups[k] {
			g, n, ra = append(g, r.Gbps), append(n, r.Native), append(ra, r.ratio())
			if r.GwCPU >= 0 {
				gw = append(gw, r.GwCPU)
			}
			if r.CliCPU >= 0 {
				cli = append(cli, r.CliCPU)
			}
		}
		a := agg{config: k.c, link: k.l, dir: k.d, streams: k.s, gbps: median(g), native: median(n), ratio: median(ra), gw: -1, cli: -1, n: len(g)}
		if len(gw) > 0 {
			a.gw = median(gw)
		}
		if len(cli) > 0 {
			a.cli = median(cli)
		}
		out = append(out, a)
	}
	return out
}

// writeSummary writes summary.tsv (medians, the plots' input), startup.tsv
// and table.md.
func writeSummary(t *testing.T, out string, rows []row, notes []string, startup []startupResult) {
	ag := aggregate(rows)
	var s strings.Builder
	s.WriteString("config\tlink\tdirection\tstreams\tgbps\tnative_gbps\tratio\tgw_cpu_s_per_gbit\tclient_cpu_s_per_gbit\treps\n")
	for _, a := range ag {
		fmt.Fprintf(&s, "%s\t%s\t%s\t%d\t%.4f\t%.4f\t%.4f\t%s\t%s\t%d\n", a.config, a.link, a.dir, a.streams, a.gbps, a.native, a.ratio, cpuStr(a.gw), cpuStr(a.cli), a.n)
	}
	if err := os.WriteFile(filepath.Join(out, "summary.tsv"), []byte(s.String()), 0o644); err != nil {
		t.Error(err)
	}

	var md strings.Builder
	writeWANTable(t, out, &md, ag)
	links := uniq(ag, func(a agg) string { return a.link })
	configs := uniq(ag, func(a agg) string { return a.config })
	for _, link := range links {
		fmt.Fprintf(&md, "\n**%s** — received Gbit/s, and in parentheses the ratio to the interleaved native run (median of reps)\n\n", linkName(link))
		md.WriteString("| streams | direction |")
		for _, c := range configs {
			fmt.Fprintf(&md, " %s |", c)
		}
		md.WriteString("\n|---|---|" + strings.Repeat("---|", len(configs)) + "\n")
		type sd struct {
			s int
			d string
		}
		var keys []sd
		seen := map[sd]bool{}
		for _, a := range ag {
			if a.link == link && !seen[sd{a.streams, a.dir}] {
				seen[sd{a.streams, a.dir}] = true
				keys = append(keys, sd{a.streams, a.dir})
			}
		}
		sort.SliceStable(keys, func(i, j int) bool {
			if keys[i].s != keys[j].s {
				return keys[i].s < keys[j].s
			}
			return keys[i].d > keys[j].d
		})
		for _, k := range keys {
			dir := "job → outside"
			if k.d == "down" {
				dir = "outside → job"
			}
			fmt.Fprintf(&md, "| %d | %s |", k.s, dir)
			for _, c := range configs {
				cell := "—"
				for _, a := range ag {
					if a.link == link && a.config == c && a.streams == k.s && a.dir == k.d {
						cell = fmt.Sprintf("%.2f (%.0f%%)", a.gbps, a.ratio*100)
					}
				}
				fmt.Fprintf(&md, " %s |", cell)
			}
			md.WriteString("\n")
		}
	}
	md.WriteString("\n**CPU seconds per transferred Gbit** (median over all runs of a configuration and link; gateway / client)\n\n| config | link | gateway | client |\n|---|---|---|---|\n")
	for _, link := range links {
		for _, c := range configs {
			var gw, cli []float64
			for _, r := range rows {
				if r.Config == c && r.Link == link && r.Gbps > 0 {
					if r.GwCPU >= 0 {
						gw = append(gw, r.GwCPU)
					}
					if r.CliCPU >= 0 {
						cli = append(cli, r.CliCPU)
					}
				}
			}
			f := func(xs []float64) string {
				if len(xs) == 0 {
					return "n/a"
				}
				return fmt.Sprintf("%.3f", median(xs))
			}
			fmt.Fprintf(&md, "| %s | %s | %s | %s |\n", c, linkName(link), f(gw), f(cli))
		}
	}
	if len(startup) > 0 {
		var st strings.Builder
		st.WriteString("what\truns\tmedian_ms\tp95_ms\tnote\n")
		md.WriteString("\n**Start-up** (wall time)\n\n| what | runs | median | p95 |\n|---|---|---|---|\n")
		for _, r := range startup {
			fmt.Fprintf(&st, "%s\t%d\t%.1f\t%.1f\t%s\n", r.what, len(r.durs), ms(r.pct(50)), ms(r.pct(95)), r.note)
			if len(r.durs) == 0 {
				fmt.Fprintf(&md, "| %s | 0 | not measured: %s | |\n", r.what, r.note)
				continue
			}
			fmt.Fprintf(&md, "| %s | %d | %.1f ms | %.1f ms |\n", r.what, len(r.durs), ms(r.pct(50)), ms(r.pct(95)))
		}
		if err := os.WriteFile(filepath.Join(out, "startup.tsv"), []byte(st.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	if len(notes) > 0 {
		md.WriteString("\nNot measured:\n\n")
		for _, n := range notes {
			md.WriteString("- " + n + "\n")
		}
	}
	if err := os.WriteFile(filepath.Join(out, "table.md"), []byte(md.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("table.md:\n%s", md.String())
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

// writeWANTable writes the runs through the impairment relay (links named
// RATE+rttNms-lossP%) as one table, rows by profile, streams and
// direction, with the interleaved native runs' median Gbit/s first and
// each configuration's Gbit/s and ratio after it; and summary-wan.tsv
// (the plot's input).
func writeWANTable(t *testing.T, out string, md *strings.Builder, ag []agg) {
	var wan []agg
	for _, a := range ag {
		if strings.Contains(a.link, "+rtt") {
			wan = append(wan, a)
		}
	}
	if len(wan) == 0 {
		return
	}
	configs := uniq(wan, func(a agg) string { return a.config })
	type key struct {
		link, dir string
		streams   int
	}
	var keys []key
	seen := map[key]bool{}
	natives := map[key][]float64{}
	for _, a := range wan {
		k := key{a.link, a.dir, a.streams}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
		natives[k] = append(natives[k], a.native)
	}
	sort.SliceStable(keys, func(i, j int) bool {
		if keys[i].link != keys[j].link {
			return keys[i].link < keys[j].link
		}
		if keys[i].streams != keys[j].streams {
			return keys[i].streams < keys[j].streams
		}
		return keys[i].dir > keys[j].dir
	})
	var tsv strings.Builder
	tsv.WriteString("config\trtt_ms\tloss_pct\tdirection\tstreams\tgbps\tnative_gbps\tratio\n")
	md.WriteString("\n**Through the impairment relay** — received Gbit/s and, in parentheses, the ratio to the interleaved native run through the same profile (median of reps); native: median of those native runs\n\n")
	md.WriteString("| link | streams | direction | native |")
	for _, c := range configs {
		fmt.Fprintf(md, " %s |", c)
	}
	md.WriteString("\n|---|---|---|---|" + strings.Repeat("---|", len(configs)) + "\n")
	for _, k := range keys {
		dir := "job → outside"
		if k.dir == "down" {
			dir = "outside → job"
		}
		fmt.Fprintf(md, "| %s | %d | %s | %.3f |", k.link, k.streams, dir, median(natives[k]))
		for _, c := range configs {
			cell := "—"
			for _, a := range wan {
				if a.link == k.link && a.config == c && a.streams == k.streams && a.dir == k.dir {
					cell = fmt.Sprintf("%.3f (%.0f%%)", a.gbps, a.ratio*100)
					var rtt, loss float64
					_, _ = fmt.Sscanf(strings.SplitN(k.link, "+", 2)[1], "rtt%gms-loss%g%%", &rtt, &loss)
					fmt.Fprintf(&tsv, "%s\t%g\t%g\t%s\t%d\t%.4f\t%.4f\t%.4f\n", c, rtt, loss, k.dir, k.streams, a.gbps, a.native, a.ratio)
				}
			}
			fmt.Fprintf(md, " %s |", cell)
		}
		md.WriteString("\n")
	}
	if err := os.WriteFile(filepath.Join(out, "summary-wan.tsv"), []byte(tsv.String()), 0o644); err != nil {
		t.Error(err)
	}
}

func uniq(ag []agg, f func(agg) string) []string {
	var out []string
	seen := map[string]bool{}
	for _, a := range ag {
		if v := f(a); !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startupResult is one start-up measurement.
type startupResult struct {
	what string
	durs []time.Duration // sorted
	note string
}

func (r startupResult) pct(p int) time.Duration {
	if len(r.durs) == 0 {
		return 0
	}
	i := (len(r.durs)*p + 99) / 100
	if i > 0 {
		i--
	}
	return r.durs[i]
}

// benchStartup measures, runs times: for airlock, `airlock run -- true` as
// the test user in cn (join, namespace and TUN, WireGuard, exec, exit,
// release; includes ip netns exec and setpriv); for ocserv, from starting
// `vpnns` and `openconnect --no-dtls` to the first TCP connection from the
// namespace that reaches inet (teardown not included).
func benchStartup(t *testing.T, what string, runs int) startupResult {
	res := startupResult{what: what}
	tp := topology.New(t, topology.WithPrefix("bs"))
	u := topology.EnsureUser(t)
	switch what {
	case "airlock":
		res.what = "airlock run -- true"
		_, gateway, pin, token, err := airlockGateway(t, tp, "user")
		if err != nil {
			res.note = err.Error()
			return res
		}
		bin := topology.BuildAirlock(t)
		for i := 0; i < runs; i++ {
			t0 := time.Now()
			code, _, stderr := tp.Run(t, 60*time.Second, tp.CN, u, bin, "run", "--gateway", gateway, "--pin", pin, "--token", token, "--", "true")
			if code != 0 {
				res.note = fmt.Sprintf("exit %d: %.300s", code, stderr)
				res.durs = nil
				return res
			}
			res.durs = append(res.durs, time.Since(t0))
		}
	case "ocserv":
		res.what = "openconnect + vpnns to first connection"
		s, err := newOcserv(t, tp, false, false)
		if err != nil {
			res.note = err.Error()
			return res
		}
		oc := s.(*ocservStack)
		failures := 0
		for i := 0; i < runs; i++ {
			home := filepath.Join(topology.TempDir(t), "home")
			if err := os.Mkdir(home, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(home, u.UID, u.GID); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			c, err := connectOpenconnectFast(t, tp, u, home, oc.srvAddr, oc.pin)
			d := time.Since(t0)
			if err != nil && failures < 5 {
				// vpnns -- sometimes loses the race with its own watcher
				// ("can't connect to watcher"); count it and try again.
				failures++
				res.note = fmt.Sprintf("%d failed attempts not counted; last: %.200s", failures, err)
				i--
				continue
			}
			if err != nil {
				res.note = err.Error()
				res.durs = nil
				return res
			}
			res.durs = append(res.durs, d)
			c.oc.kill()
			c.ns.Kill()
		}
	}
	sort.Slice(res.durs, func(i, j int) bool { return res.durs[i] < res.durs[j] })
	t.Logf("%s: %d runs, median %.1f ms, p95 %.1f ms", res.what, len(res.durs), ms(res.pct(50)), ms(res.pct(95)))
	return res
}
