// SPDX-License-Identifier: MIT

package topology_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/impair"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestImpairmentCost measures what the relay costs when it impairs
// nothing: native iperf3 (one stream, both directions) on 1 Gbit links
// through the relay, against the same on a topology without it, run
// alternately. The target is < 5 %, measured by the benchmarks (speed is
// measured there, not in tests: on a shared 2-core machine a 3-second
// iperf3 varies by more than that, and this test failed at 86 % once).
// The test fails below half of the direct path: a relay that collapses.
func TestImpairmentCost(t *testing.T) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not installed")
	}
	secs := 3
	if v, err := strconv.Atoi(os.Getenv("AIRLOCK_IMPAIR_COST_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	direct := topology.New(t, topology.WithNativeRouting(), topology.WithRate("1gbit"))
	relayed := topology.New(t, topology.WithNativeRouting(), topology.WithRate("1gbit"), topology.WithImpairment(impair.Config{}))
	u := topology.EnsureUser(t)
	dport, rport := direct.StartIperf3Server(t), relayed.StartIperf3Server(t)
	run := func(tp *topology.Topology, port int, reverse bool) float64 {
		args := []string{"-c", tp.INETAddr.String(), "-p", strconv.Itoa(port), "-t", strconv.Itoa(secs), "--json", "--connect-timeout", "5000"}
		if reverse {
			args = append(args, "-R")
		}
		code, out, stderr := tp.Run(t, time.Duration(secs+30)*time.Second, tp.CN, u, "iperf3", args...)
		var r struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 {
			t.Fatalf("iperf3 %v: exit %d, %v: %.300s %s", args, code, err, out, stderr)
		}
		return r.End.SumReceived.BitsPerSecond
	}
	defer func() { t.Logf("relay log:\n%s", relayed.RelayLog()) }()
	for _, reverse := range []bool{false, true} {
		name := "cn→inet"
		if reverse {
			name = "inet→cn"
		}
		r := run(relayed, rport, reverse)
		d := run(direct, dport, reverse)
		ratio := r / d
		t.Logf("%s, 1 Gbit links, iperf3 -t %d: through the relay %.3f Gbit/s, direct %.3f Gbit/s, ratio %.3f", name, secs, r/1e9, d/1e9, ratio)
		if ratio < 0.5 {
			t.Logf("relay log:\n%s", relayed.RelayLog())
			t.Errorf("%s: the transparent relay carries %.0f%% of the direct path; want ≥ 50%% (target ≥ 95%%, measured by the benchmarks)", name, ratio*100)
		}
	}
}
