// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/loadgen"
	"github.com/airlock-vpn/airlock/test/topology"
)

// scaleJobs is how many simulated jobs TestScale runs; the gateway gets
// exactly that many port blocks, so that it is full.
const scaleJobs = 200

// TestScale runs scaleJobs simulated jobs (airlock-testpeer jobs, one
// process in cn: airlock run's client session for each, with real joins,
// WireGuard handshakes, control sessions, renewals and a UDP echo through
// each tunnel) against a user-mode gateway with exactly scaleJobs port
// blocks: every job joins and its traffic flows; status shows the blocks
// all used and the capacity bound; the next job is refused with a message
// that names the bound and the flag that widens it; the jobs' renewals
// succeed while they idle; after a kill -9 and a restart every job's
// traffic flows again within 10 s, the gateway having started the
// handshakes itself. The large measurements are in bench/
// (docs/benchmarks.md, "Scale").
func TestScale(t *testing.T) {
	const block = 16
	lo := 40000
	ports := fmt.Sprintf("%d-%d", lo, lo+scaleJobs*block-1)
	e := newEnvMode(t, modeUser, "--egress-ports", ports, "--block-size", strconv.Itoa(block), "--renew-interval", "2s")
	capLine := fmt.Sprintf("capacity: %d concurrent jobs, bound by egress port blocks", scaleJobs)
	if !strings.Contains(e.gw.Stderr(), capLine) {
		t.Errorf("gateway start-up log lacks %q%s", capLine, e.diag(""))
	}
	echo := netip.AddrPortFrom(e.tp.INETAddr, uint16(e.udpPort))
	start := time.Now()
	gen := e.tp.Start(t, e.tp.CN, nil, e.peer, "jobs", "-gateway", e.gateway, "-pin", e.pin, "-token", e.token,
		"-n", strconv.Itoa(scaleJobs), "-over", "5s", "-hold", "5m", "-echo", echo.String(), "-echo-every", "3s")
	first := waitReport(t, gen, "start", 90*time.Second)
	t.Logf("%d jobs started in %.1f s: join p50 %.0f ms p99 %.0f ms max %.0f ms; handshake p50 %.0f ms p99 %.0f ms; first echo p50 %.0f ms p99 %.0f ms",
		first.OK, first.Seconds, first.Join.P50, first.Join.P99, first.Join.Max, first.Handshake.P50, first.Handshake.P99, first.Echo.P50, first.Echo.P99)
	if first.OK != scaleJobs || first.Failed != 0 {
		t.Fatalf("%d of %d jobs started, %d failed: %v", first.OK, scaleJobs, first.Failed, first.Errors)
	}

	code, out, stderr := e.admin(t, "status", "--state", e.state)
	for _, want := range []string{
		fmt.Sprintf("port blocks %d of %d in use, 0 free", scaleJobs, scaleJobs),
		"capacity:   " + strconv.Itoa(scaleJobs) + " concurrent jobs, bound by egress port blocks",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("airlock status: exit %d, lacks %q:\n%s%s", code, want, firstLines(out, 6), e.diag(stderr))
		}
	}
	// One more job: refused, naming the bound and the flags.
	code, _, stderr = e.runWith(t, runOpts{timeout: 40 * time.Second}, "true")
	if code != 125 || !strings.Contains(stderr, "port blocks") || !strings.Contains(stderr, "--egress-ports") {
		t.Errorf("job %d on a full gateway: exit %d, want 125 with a message naming the port blocks and --egress-ports: %q", scaleJobs+1, code, stderr)
	}

	// Idle a few renew intervals, echoing every 3 s.
	time.Sleep(7 * time.Second)
	if err := gen.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	idle := waitReport(t, gen, "snapshot", 30*time.Second)
	t.Logf("idle after %v: %d echoes ok, %d failed, %d renew errors, %d sessions lost", time.Since(start).Round(time.Second),
		idle.EchoOK, idle.EchoFail, idle.RenewErrors, idle.WatchErrors)
	if idle.RenewErrors != 0 || idle.WatchErrors != 0 {
		t.Errorf("idle jobs: %d renew errors, %d sessions lost; want none", idle.RenewErrors, idle.WatchErrors)
	}
	if idle.EchoOK < scaleJobs || idle.EchoFail != 0 {
		t.Errorf("idle jobs' echoes: %d ok, %d failed; want at least %d ok and none failed", idle.EchoOK, idle.EchoFail, scaleJobs)
	}

	// A crash: once the gateway has saved every job's endpoint (every
	// 15 s), kill -9 it and start it again. It restores the leases and
	// starts the handshakes itself: every job's traffic flows again
	// within seconds, with no job re-joining.
	endpoints := filepath.Join(e.state, "endpoints")
	deadline := time.Now().Add(40 * time.Second)
	for n := 0; n < scaleJobs; {
		b, _ := os.ReadFile(endpoints)
		n = strings.Count(string(b), "\n")
		if time.Now().After(deadline) {
			t.Fatalf("the gateway saved %d of %d endpoints within 40 s", n, scaleJobs)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := e.gw.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := e.gw.Wait(15 * time.Second); err != nil {
		t.Fatalf("killed gateway: %v", err)
	}
	killed := time.Now()
	e.startGateway(t)
	back := time.Now()
	if err := gen.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	probe := waitReport(t, gen, "probe", 90*time.Second)
	t.Logf("restart after kill -9 (down %v): %d of %d jobs flowing again, p50 %.0f ms p99 %.0f ms max %.0f ms after the restarted gateway was ready",
		back.Sub(killed).Round(time.Millisecond), probe.OK, scaleJobs, probe.Echo.P50, probe.Echo.P99, probe.Echo.Max)
	// The target, every job within 10 s for 2,000 jobs, is the
	// scale benchmark's (8.5 s there); here a stray job's handshake may
	// need wireguard-go's second retry (one run: p50 1.2 s, the last of
	// 200 at 10.0 s), so the test fails past 15 s: a herd or a lost job.
	if probe.OK != scaleJobs || probe.Echo.Max > 15000 {
		t.Errorf("after the restart: %d of %d jobs flowing, the last after %.0f ms; want all within 15 s%s", probe.OK, scaleJobs, probe.Echo.Max, e.diag(""))
	}
	if n := strings.Count(e.gw.Stderr(), "lease restored"); n != scaleJobs {
		t.Errorf("the restarted gateway restored %d leases, want %d", n, scaleJobs)
	}
	if !strings.Contains(e.gw.Stderr(), "handshakes with the restored jobs started") {
		t.Errorf("the restarted gateway did not start the handshakes itself%s", e.diag(""))
	}

	if err := gen.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	end := waitReport(t, gen, "end", 60*time.Second)
	t.Logf("after %v: %d echoes ok, %d failed, %d renew errors, %d sessions lost, %d restarts seen", time.Since(start).Round(time.Second),
		end.EchoOK, end.EchoFail, end.RenewErrors, end.WatchErrors, end.Restarts)
	if end.Restarts != scaleJobs {
		t.Errorf("%d jobs saw the gateway's new instance, want all %d", end.Restarts, scaleJobs)
	}
	if end.Rejoins != 0 {
		t.Errorf("%d jobs had to join again after the restart: leases not kept", end.Rejoins)
	}
}

// waitReport waits for the load generator's report of phase on its
// stdout.
func waitReport(t *testing.T, p *topology.Process, phase string, timeout time.Duration) loadgen.Report {
	t.Helper()
	var r loadgen.Report
	found := func() bool {
		for _, l := range strings.Split(p.Stdout(), "\n") {
			var lr loadgen.Report
			if json.Unmarshal([]byte(l), &lr) == nil && lr.Phase == phase {
				r = lr
				return true
			}
		}
		return false
	}
	// Once the generator has exited, its whole output is in.
	if !topology.Poll(timeout, func() bool { ok, _ := p.Exited(); return found() || ok }) || !found() {
		ok, code := p.Exited()
		t.Fatalf("load generator: no %q report (exited %v, %d): %s\n%s", phase, ok, code, p.Stdout(), tailString(p.Stderr(), 3000))
	}
	return r
}

func firstLines(s string, n int) string {
	l := strings.SplitN(s, "\n", n+1)
	return strings.Join(l[:min(n, len(l))], "\n")
}

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
