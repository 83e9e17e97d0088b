// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// Limits of TestLimits's gateways, for the jobs of token limitedToken.
const (
	limitedToken  = "limited"
	limitRate     = 100e6 // bits/s, each direction
	limitMaxFlows = 4
	limitNewFlows = 10 // per second
	iperfSeconds  = 10
)

// TestLimits runs, in each egress mode, a gateway whose jobs of one token
// are limited to 100 Mbit/s each way, 4 concurrent flows and 10 new flows
// per second, while other jobs are not limited:
//   - a limited and an unlimited job send (then receive) with iperf3 at
//     the same time for 10 s: the limited one gets at most 100 Mbit/s
//     +10% (and at least half), the unlimited one clearly more (at least
//     twice that);
//   - the limited job opens 6 connections: 4 work, 2 are refused at once
//     (< 1 s), and the 4 still work afterwards;
//   - it opens 30 connections in a row, closing each: about 10 (the burst)
//     pass, the rest are refused at once.
func TestLimits(t *testing.T) {
	for _, mode := range []string{modeUser, modeUserNetstack, modeKernel} {
		t.Run(mode, func(t *testing.T) {
			e := newEnvMode(t, mode,
				"--job-egress-rate", "100mbit", "--job-ingress-rate", "100mbit",
				"--job-max-flows", strconv.Itoa(limitMaxFlows), "--job-new-flows-per-sec", strconv.Itoa(limitNewFlows),
				"--job-limits-tokens", limitedToken)
			limited := e.createToken(t, limitedToken)
			ports := []int{e.tp.StartIperf3Server(t), e.tp.StartIperf3Server(t)}
			t.Run("bandwidth", func(t *testing.T) {
				for _, reverse := range []bool{false, true} {
					dir := "egress (job → outside)"
					if reverse {
						dir = "ingress (outside → job)"
					}
					lim, free := e.iperfPair(t, limited, ports, reverse)
					t.Logf("%s mode, %s, iperf3 -t %d, both jobs at once: limited job %.1f Mbit/s (limit %.0f), unlimited job %.1f Mbit/s",
						mode, dir, iperfSeconds, lim/1e6, limitRate/1e6, free/1e6)
					// The cap is the property (at most 10 % over); below it,
					// only a limiter that throttles far under its rate
					// fails: on a loaded shared machine a limited TCP flow
					// was seen at 75–85 % of the cap (speed is measured
					// by the benchmarks, not here).
					if lim < 0.5*limitRate || lim > 1.1*limitRate {
						t.Errorf("%s: limited job got %.1f Mbit/s, want at most %.0f (+10%%) and at least half of it", dir, lim/1e6, limitRate/1e6)
					}
					if free < 2*limitRate {
						t.Errorf("%s: unlimited job got %.1f Mbit/s next to the limited one, want at least %.0f", dir, free/1e6, 2*limitRate/1e6)
					}
				}
			})
			echo := e.tp.Port()
			p := e.tp.Start(t, e.tp.INET, nil, e.peer, "tcpecho", fmt.Sprintf("0.0.0.0:%d", echo))
			srv := netip.AddrPortFrom(e.tp.INETAddr, uint16(echo))
			e.tp.WaitTCP(t, e.tp.INET, srv, p)
			t.Run("max-flows", func(t *testing.T) {
				over := 2
				code, out, stderr := e.runWith(t, runOpts{token: limited}, e.peer, "tcpflows", srv.String(), strconv.Itoa(limitMaxFlows+over), "1s")
				var ok, failed, alive int
				var ds string
				if _, err := fmt.Sscanf(out, "ok=%d failed=%d slowest_failure=%s alive=%d", &ok, &failed, &ds, &alive); code != 0 || err != nil {
					t.Fatalf("tcpflows: exit %d, %q (%v)%s", code, out, err, e.diag(stderr))
				}
				slowest, _ := time.ParseDuration(ds)
				t.Logf("%s mode, max %d flows: %d connections in a row: ok=%d failed=%d slowest failure %v, %d alive after 1 s",
					mode, limitMaxFlows, limitMaxFlows+over, ok, failed, slowest, alive)
				if ok != limitMaxFlows || failed != over || alive != ok {
					t.Errorf("got ok=%d failed=%d alive=%d, want ok=%d failed=%d alive=%d", ok, failed, alive, limitMaxFlows, over, limitMaxFlows)
				}
				if slowest >= time.Second {
					t.Errorf("slowest refusal took %v, want < 1 s", slowest)
				}
				// An unlimited job next to it is not limited.
				code, out, stderr = e.run(t, e.peer, "tcpflows", srv.String(), strconv.Itoa(limitMaxFlows+over), "0s")
				if code != 0 || !strings.HasPrefix(out, fmt.Sprintf("ok=%d failed=0 ", limitMaxFlows+over)) {
					t.Errorf("unlimited job: exit %d, %q, want all %d ok%s", code, out, limitMaxFlows+over, e.diag(stderr))
				}
			})
			t.Run("new-flows", func(t *testing.T) {
				const n = 30
				time.Sleep(time.Second) // refill the new-flow bucket
				code, out, stderr := e.runWith(t, runOpts{token: limited}, e.peer, "tcpburst", srv.String(), strconv.Itoa(n))
				var ok, failed int
				var ds string
				if _, err := fmt.Sscanf(out, "ok=%d failed=%d slowest_failure=%s", &ok, &failed, &ds); code != 0 || err != nil {
					t.Fatalf("tcpburst: exit %d, %q (%v)%s", code, out, err, e.diag(stderr))
				}
				slowest, _ := time.ParseDuration(strings.TrimSpace(ds))
				t.Logf("%s mode, %d new flows/s: %d connections in a row: ok=%d failed=%d slowest failure %v", mode, limitNewFlows, n, ok, failed, slowest)
				// The burst (10, kernel 11) plus what refills while the
				// loop runs.
				if ok < limitNewFlows || ok > n-10 || failed+ok != n {
					t.Errorf("got ok=%d failed=%d, want about %d ok and at least 10 refused", ok, failed, limitNewFlows)
				}
				if slowest >= time.Second {
					t.Errorf("slowest refusal took %v, want < 1 s", slowest)
				}
			})
			// An iperf3 server of its own: the bandwidth subtest's may
			// still be finishing its last test ("the server is busy").
			t.Run("IPv6", func(t *testing.T) { checkLimitsIPv6(t, e, limited, e.tp.StartIperf3Server(t)) })
		})
	}
}

// iperfPair runs iperf3 for iperfSeconds in a job of token limited (to
// ports[0]) and in an unlimited job (to ports[1]) at the same time, and
// returns the bits per second each received.
func (e *env) iperfPair(t *testing.T, limited string, ports []int, reverse bool) (lim, free float64) {
	t.Helper()
	args := func(port int) []string {
		a := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-p", strconv.Itoa(port), "-t", strconv.Itoa(iperfSeconds), "--json", "--connect-timeout", "5000"}
		if reverse {
			a = append(a, "-R")
		}
		return a
	}
	procs := []*topology.Process{
		e.startWith(t, runOpts{token: limited}, args(ports[0])...),
		e.start(t, args(ports[1])...),
	}
	var got []float64
	for i, p := range procs {
		code, err := p.Wait(time.Duration(iperfSeconds)*time.Second + 60*time.Second)
		if err != nil {
			t.Fatalf("iperf3 job %d: %v%s", i, err, e.diag(p.Stderr()))
		}
		got = append(got, parseIperf(t, fmt.Sprintf("job %d", i), code, p.Stdout(), p.Stderr(), e.diag(p.Stderr())))
	}
	return got[0], got[1]
}

// checkLimitsIPv6: in every mode a job's IPv6 flows are under its limits:
// the bandwidth limit (iperf3 over IPv6 to iperfPort for 3 s) and the
// flow limit (MaxFlows connections over IPv6, the rest refused at once).
func checkLimitsIPv6(t *testing.T, e *env, limited string, iperfPort int) {
	args := []string{"iperf3", "-6", "-c", topology.INETAddr6.String(), "-p", strconv.Itoa(iperfPort), "-t", "3", "--json", "--connect-timeout", "5000"}
	code, out, stderr := e.runWith(t, runOpts{token: limited}, args...)
	bps := parseIperf(t, "limited job over IPv6", code, out, stderr, e.diag(stderr))
	t.Logf("%s mode: limited job, iperf3 -6 -t 3: %.1f Mbit/s (limit %.0f)", e.mode, bps/1e6, limitRate/1e6)
	// The cap is the property; see TestLimits for the lower bound.
	if bps < 0.5*limitRate || bps > 1.15*limitRate {
		t.Errorf("limited job over IPv6 got %.1f Mbit/s, want at most %.0f (+15%%) and at least half of it", bps/1e6, limitRate/1e6)
	}
	port := e.tp.Port()
	p := e.tp.Start(t, e.tp.INET, nil, e.peer, "tcpecho", fmt.Sprintf("[::]:%d", port))
	srv := netip.AddrPortFrom(topology.INETAddr6, uint16(port))
	e.tp.WaitTCP(t, e.tp.INET, srv, p)
	time.Sleep(time.Second) // refill the new-flow bucket
	const over = 2
	code, out, stderr = e.runWith(t, runOpts{token: limited}, e.peer, "tcpflows", srv.String(), strconv.Itoa(limitMaxFlows+over), "0s")
	var ok, failed int
	if _, err := fmt.Sscanf(out, "ok=%d failed=%d", &ok, &failed); code != 0 || err != nil {
		t.Fatalf("tcpflows over IPv6: exit %d, %q (%v)%s", code, out, err, e.diag(stderr))
	}
	if ok != limitMaxFlows || failed != over {
		t.Errorf("tcpflows over IPv6: ok=%d failed=%d, want ok=%d failed=%d (max %d flows)", ok, failed, limitMaxFlows, over, limitMaxFlows)
	}
}
