// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestCaptureCost measures what a standing capture feed costs in
// throughput, in both egress modes: one gateway, one iperf3 server, and
// iperf3 runs (one stream, -t 5, both directions) alternating between
// the config without a [[capture]] feed and with one capturing every
// packet of every job into /dev/null (switched by airlock gateway reload,
// so both halves share the topology, gateway and moment). It logs a table
// with the load average and the gateway's CPU seconds per Gbit; it
// asserts nothing about speed. It runs only with AIRLOCK_BENCH=1:
//
//	AIRLOCK_BENCH=1 go test -count=1 -v -run TestCaptureCost ./test/e2e
func TestCaptureCost(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH") != "1" {
		t.Skip("a benchmark: set AIRLOCK_BENCH=1")
	}
	reps := 3
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_BENCH_REPS")); err == nil && v > 0 {
		reps = v
	}
	var report strings.Builder
	fmt.Fprintf(&report, "| mode | direction | capture | Gbit/s per run | median | gateway CPU s/Gbit (median) | load average (1 min) at each run |\n|---|---|---|---|---|---|---|\n")
	for _, mode := range []string{modeUser, modeKernel} {
		t.Run(mode, func(t *testing.T) { captureCost(t, mode, reps, &report) })
	}
	t.Logf("iperf3 -P 1 -t 5 through the gateway, capture off vs a [[capture]] feed of everything to /dev/null, alternating, %d runs each:\n%s", reps, report.String())
}

func captureCost(t *testing.T, mode string, reps int, report *strings.Builder) {
	dir := topology.TempDir(t)
	conf := filepath.Join(dir, "gateway.toml")
	plain := "version = 1\n"
	capturing := "version = 1\n[[capture]]\nname = \"all\"\nto = \"/dev/null\"\n"
	if err := os.WriteFile(conf, []byte(plain), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnvMode(t, mode, "--config", conf)
	port := e.tp.StartIperf3Server(t)
	type sample struct{ gbps, cpuPerGbit, load float64 }
	results := map[string][]sample{}
	for rep := 0; rep < reps; rep++ {
		for _, on := range []bool{false, true} {
			doc := plain
			if on {
				doc = capturing
			}
			if err := os.WriteFile(conf, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			if code, _, stderr := e.admin(t, "gateway", "reload", "--state", e.state); code != 0 {
				t.Fatalf("reload: exit %d: %s", code, stderr)
			}
			for _, reverse := range []bool{false, true} {
				args := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-p", strconv.Itoa(port), "-t", "5", "--json", "--connect-timeout", "5000"}
				dirName := "job → outside"
				if reverse {
					args = append(args, "-R")
					dirName = "outside → job"
				}
				var load, cpu float64
				var code int
				var out, stderr string
				// iperf3's server takes a moment after a test before it
				// accepts the next one, and sometimes stays busy: then
				// a fresh server.
				for try := 0; try < 10; try++ {
					if try == 5 {
						port = e.tp.StartIperf3Server(t)
						args[4] = strconv.Itoa(port)
					}
					load = loadAvg(t)
					cpu0 := procCPU(e.gw.Cmd.Process.Pid)
					code, out, stderr = e.runWith(t, runOpts{timeout: 60 * time.Second}, args...)
					cpu = procCPU(e.gw.Cmd.Process.Pid) - cpu0
					if !strings.Contains(out, "server is busy") {
						break
					}
					time.Sleep(500 * time.Millisecond)
				}
				bps := parseIperf(t, "airlock", code, out, stderr, e.diag(stderr))
				key := fmt.Sprintf("%s|%s|%v", mode, dirName, on)
				results[key] = append(results[key], sample{bps / 1e9, cpu / (bps / 1e9 * 5), load})
			}
		}
	}
	for _, dirName := range []string{"job → outside", "outside → job"} {
		for _, on := range []bool{false, true} {
			s := results[fmt.Sprintf("%s|%s|%v", mode, dirName, on)]
			var runs, loads []string
			var g, c []float64
			for _, x := range s {
				runs = append(runs, fmt.Sprintf("%.2f", x.gbps))
				loads = append(loads, fmt.Sprintf("%.1f", x.load))
				g, c = append(g, x.gbps), append(c, x.cpuPerGbit)
			}
			name := "off"
			if on {
				name = "all → /dev/null"
			}
			fmt.Fprintf(report, "| %s | %s | %s | %s | %.2f | %.2f | %s |\n", mode, dirName, name, strings.Join(runs, ", "), median(g), median(c), strings.Join(loads, ", "))
		}
	}
}

// loadAvg is the host's 1-minute load average.
func loadAvg(t *testing.T) float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		t.Fatal(err)
	}
	v, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return v
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
