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

// Bounds of TestNeighbourLatency on what another job's bulk transfer may
// do to a job's round trips. They are generous on purpose: the test
// machine is shared and loaded (at a load average of 35 on 2 cores, job
// B's idle p99 was 249 ms and its p50 0.86 ms), and the figures that
// matter (a few ms, against wireguard-go's) are bench/run.sh's latency
// run. What they catch is a gateway that queues one job's packets behind
// another's backlog: a standing queue moves the median, not only the
// tail, and a stall moves the tail by seconds.
const (
	neighbourP50Bound = 50 * time.Millisecond // added to B's p50
	neighbourP99Floor = time.Second           // B's p99 may reach max(this, 4 × its idle p99)
)

// TestNeighbourLatency runs, through a user-mode gateway, a bulk iperf3
// transfer in job A (download, then upload) while job B measures TCP
// round trips (bench/rr: 64 bytes every 10 ms on one connection) to the
// outside: every round trip completes, B's p50 grows by less than
// neighbourP50Bound and its p99 stays under max(neighbourP99Floor, 4 ×
// its p99 with A idle); A's transfer runs meanwhile.
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
		ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
		if added := ms(under.P50ms - idle.P50ms); added > neighbourP50Bound {
			t.Errorf("A's bulk %s added %v to job B's p50 round trip (%.2f ms → %.2f ms), want at most %v", dir, added, idle.P50ms, under.P50ms, neighbourP50Bound)
		}
		if bound := max(neighbourP99Floor, 4*ms(idle.P99ms)); ms(under.P99ms) > bound {
			t.Errorf("A's bulk %s took job B's p99 round trip to %.2f ms (idle %.2f ms), want at most %v", dir, under.P99ms, idle.P99ms, bound)
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
