// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// neighbourBound is what another job's bulk transfer may add to a job's
// p99 round trip in TestNeighbourLatency. It is generous on purpose: the
// test machine is shared and loaded, and the figure that matters (a few
// ms, against wireguard-go's) is bench/run.sh's latency run; this test
// catches a gateway that queues one job's packets behind another's
// backlog (tens to hundreds of ms, or a stall).
const neighbourBound = 150 * time.Millisecond

// TestNeighbourLatency runs, through a user-mode gateway, a bulk iperf3
// transfer in job A (download, then upload) while job B measures TCP
// round trips (bench/rr: 64 bytes every 10 ms on one connection) to the
// outside: every round trip completes, and B's p99 grows by less than
// neighbourBound over its p99 with A idle; A's transfer runs meanwhile.
func TestNeighbourLatency(t *testing.T) {
	e := newEnvMode(t, modeUser)
	rr := topology.BuildRR(t)
	port := e.tp.Port()
	srv := netip.AddrPortFrom(e.tp.INETAddr, uint16(port))
	p := e.tp.Start(t, e.tp.INET, nil, rr, "serve", "-listen", srv.String())
	e.tp.WaitTCP(t, e.tp.INET, srv, p)
	iperfPort := e.tp.StartIperf3Server(t)

	// Each probe is a job B of its own (one airlock run), beside A's.
	probe := func(what string) rrResult {
		t.Helper()
		code, out, stderr := e.runWith(t, runOpts{timeout: 90 * time.Second}, rr, "client", "-addr", srv.String(), "-count", "300", "-interval", "10ms", "-timeout", "60s")
		var r rrResult
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || r.N != 300 {
			t.Fatalf("%s: rr client: exit %d, %q (%v), want 300 round trips%s", what, code, out, err, e.diag(stderr))
		}
		t.Logf("%s: job B's round trip p50 %.2f ms, p99 %.2f ms, max %.2f ms", what, r.P50ms, r.P99ms, r.Maxms)
		return r
	}
	idle := probe("A idle")
	for _, reverse := range []bool{true, false} {
		dir := "upload"
		if reverse {
			dir = "download"
		}
		args := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-p", strconv.Itoa(iperfPort), "-t", "12", "--json", "--connect-timeout", "5000"}
		if reverse {
			args = append(args, "-R")
		}
		bulk := e.start(t, args...)
		time.Sleep(3 * time.Second) // A's join and its flow's ramp
		under := probe(fmt.Sprintf("A's bulk %s", dir))
		code, err := bulk.Wait(90 * time.Second)
		if err != nil {
			t.Fatalf("job A's iperf3 %s: %v%s", dir, err, e.diag(bulk.Stderr()))
		}
		bps := parseIperf(t, "job A "+dir, code, bulk.Stdout(), bulk.Stderr(), e.diag(bulk.Stderr()))
		t.Logf("job A's bulk %s: %.0f Mbit/s", dir, bps/1e6)
		added := time.Duration((under.P99ms - idle.P99ms) * float64(time.Millisecond))
		if added > neighbourBound {
			t.Errorf("A's bulk %s added %v to job B's p99 round trip (%.2f ms → %.2f ms), want at most %v", dir, added, idle.P99ms, under.P99ms, neighbourBound)
		}
	}
}

// rrResult is bench/rr's client output.
type rrResult struct {
	N     int     `json:"n"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
	Maxms float64 `json:"max_ms"`
}
