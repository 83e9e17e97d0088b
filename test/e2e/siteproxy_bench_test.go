// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// SiteProxyBenchEnv, set to a number of repetitions, runs
// TestSiteProxyBenchmark.
const SiteProxyBenchEnv = "AIRLOCK_PROXY_BENCH"

// TestSiteProxyBenchmark measures what the site's web proxy costs the TCP
// transport: iperf3 from a job to inet over --transport tcp, directly to
// the gateway (cn → dmz) and through a real squid in the site network
// (cn → site → dmz, direct TCP to the gateway refused by a rule in cn so
// that airlock run takes the proxy), interleaved, reps repetitions of
// each direction, with /proc/loadavg before each point. It only runs with
// AIRLOCK_PROXY_BENCH=N; results go to the test log (docs/benchmarks.md
// has them).
func TestSiteProxyBenchmark(t *testing.T) {
	reps, _ := strconv.Atoi(os.Getenv(SiteProxyBenchEnv))
	if reps <= 0 {
		t.Skipf("a benchmark: set %s=REPS to run it", SiteProxyBenchEnv)
	}
	secs := 5
	e := newEnvTopo(t, modeUser, []topology.Option{topology.WithSiteUplink()})
	squid := e.tp.StartSquidWith(t, topology.SquidOptions{})
	port := e.tp.StartIperf3Server(t)
	proxyEnv := fmt.Sprintf("HTTPS_PROXY=http://%s:%d", topology.SiteAddr, squid.Port)
	nft := func(args ...string) {
		if code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.CN, nil, "nft", args...); code != 0 {
			t.Fatalf("nft %s in cn: exit %d %s %s", strings.Join(args, " "), code, out, stderr)
		}
	}
	blockDirect := func(on bool) {
		if !on {
			nft("delete", "table", "inet", "airlockbench")
			return
		}
		nft("add", "table", "inet", "airlockbench")
		nft("add", "chain", "inet", "airlockbench", "out", "{", "type", "filter", "hook", "output", "priority", "0", ";", "}")
		nft("add", "rule", "inet", "airlockbench", "out", "ip", "daddr", e.tp.DMZAddrCN.String(), "tcp", "dport", strconv.Itoa(gatewayPort), "reject", "with", "tcp", "reset")
	}
	type point struct{ gbps, load float64 }
	got := map[string][]point{}
	var order []string
	for r := 0; r < reps; r++ {
		for _, via := range []string{"direct", "squid"} {
			for _, reverse := range []bool{false, true} {
				name := via + ", job → outside"
				args := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-p", strconv.Itoa(port), "-t", strconv.Itoa(secs), "--json", "--connect-timeout", "5000"}
				if reverse {
					args, name = append(args, "-R"), via+", outside → job"
				}
				o := runOpts{flags: []string{"--transport", "tcp", "--log-level", "info"}, timeout: 60 * time.Second}
				if via == "squid" {
					o.env = []string{proxyEnv}
					blockDirect(true)
				}
				load := loadAvg(t)
				code, out, stderr := e.runWith(t, o, args...)
				if via == "squid" {
					blockDirect(false)
					if !strings.Contains(stderr, "through the site's web proxy") {
						t.Fatalf("the squid point did not go through squid:\n%s", stderr)
					}
				}
				bps := parseIperf(t, name, code, out, stderr, e.diag(stderr))
				if _, ok := got[name]; !ok {
					order = append(order, name)
				}
				got[name] = append(got[name], point{bps / 1e9, load})
			}
		}
	}
	median := func(ps []point) float64 {
		v := make([]float64, len(ps))
		for i, p := range ps {
			v[i] = p.gbps
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	t.Logf("iperf3 -t %d over --transport tcp, %d interleaved repetitions, uncapped veths; load = 1-min loadavg before each point", secs, reps)
	for _, name := range order {
		base := median(got["direct, "+strings.SplitN(name, ", ", 2)[1]])
		var pts []string
		for _, p := range got[name] {
			pts = append(pts, fmt.Sprintf("%.2f@%.1f", p.gbps, p.load))
		}
		t.Logf("| %s | %.2f Gbit/s | %.2f of direct | %s |", name, median(got[name]), median(got[name])/base, strings.Join(pts, " "))
	}
}
