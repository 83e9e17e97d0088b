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

	"github.com/airlock-vpn/airlock/test/topology"
)

// BypassBenchEnv, set to a number of repetitions, runs
// TestBypassBenchmark; BypassBenchRateEnv, if set, caps every link at that
// tc rate (e.g. 1gbit).
const (
	BypassBenchEnv     = "AIRLOCK_BYPASS_BENCH"
	BypassBenchRateEnv = "AIRLOCK_BYPASS_BENCH_RATE"
)

// TestBypassBenchmark measures a job's download of a 256 MiB file from an
// HTTP server on the site network through the site-local bypass (netns
// and seccomp modes), against the same download natively from cn and the
// same file from the same server program in inet through the gateway
// (user mode, kernel TCP). The runs are interleaved, N repetitions each.
// It only runs with AIRLOCK_BYPASS_BENCH=N; results go to the test log
// (docs/benchmarks.md has them).
func TestBypassBenchmark(t *testing.T) {
	reps, _ := strconv.Atoi(os.Getenv(BypassBenchEnv))
	if reps <= 0 {
		t.Skipf("a benchmark: set %s=REPS to run it", BypassBenchEnv)
	}
	const size = 256 << 20
	topology.RequireRoot(t)
	u := topology.EnsureUser(t)
	dir := topology.TempDir(t)
	if err := os.Chown(dir, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "gateway.toml")
	var sitePort, inetPort int
	topo := []topology.Option{topology.WithSite()}
	if r := os.Getenv(BypassBenchRateEnv); r != "" {
		topo = append(topo, topology.WithRate(r))
	}
	e := newEnvHook(t, modeUser, topo, func(e *env) []string {
		sitePort, _ = e.tp.StartHTTPIn(t, e.tp.Site, topology.SiteAddr, map[string]int64{"bench": size})
		inetPort, _ = e.tp.StartHTTP(t, map[string]int64{"bench": size})
		conf := fmt.Sprintf("version = 1\n[[policy.rule]]\nname = \"site\"\naction = \"allow\"\nto = [\"%s\"]\n[[bypass]]\nname = \"site-http\"\nto = [\"%s\"]\nproto = \"tcp\"\nports = [%d]\n",
			topology.SitePrefix, topology.SiteAddr, sitePort)
		if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{"--config", file}
	})
	site := fmt.Sprintf("http://%s:%d/bench", topology.SiteAddr, sitePort)
	inet := fmt.Sprintf("http://%s:%d/bench", e.tp.INETAddr, inetPort)
	curl := func(url string) []string {
		return []string{"curl", "-sS", "--noproxy", "*", "--max-time", "120", "-o", "/dev/null", "-w", "%{speed_download}\n", url}
	}
	type config struct {
		name string
		argv []string
		job  bool
	}
	configs := []config{
		{"native (cn → site)", curl(site), false},
		{"bypass, netns (job → site)", e.command(runOpts{flags: []string{"--mode", "netns"}}, curl(site)...), true},
		{"bypass, seccomp (job → site)", e.command(runOpts{flags: []string{"--mode", "seccomp"}}, curl(site)...), true},
		{"gateway, netns (job → inet)", e.command(runOpts{flags: []string{"--mode", "netns"}}, curl(inet)...), true},
	}
	got := map[string][]float64{}
	for r := 0; r < reps; r++ {
		for _, c := range configs {
			code, out, stderr := e.tp.Run(t, runTimeout, e.tp.CN, e.u, c.argv[0], c.argv[1:]...)
			lines := strings.Fields(out)
			var bps float64
			if len(lines) > 0 {
				bps, _ = strconv.ParseFloat(lines[len(lines)-1], 64)
			}
			if code != 0 || bps == 0 {
				t.Fatalf("%s: exit %d, %q%s", c.name, code, out, e.diag(stderr))
			}
			got[c.name] = append(got[c.name], bps*8/1e9)
		}
	}
	median := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return s[len(s)/2]
	}
	native := median(got[configs[0].name])
	for _, c := range configs {
		m := median(got[c.name])
		t.Logf("| %s | %.2f | %.2f | %v |", c.name, m, m/native, got[c.name])
	}
}
