// SPDX-License-Identifier: MIT

package bench

// The several-gateways phase of TestScaleBench (-scale.gateways 3): three
// user-mode gateways, one per DMZ namespace (dmz, dmz2, dmz3 of a
// topology WithThirdDMZ), each with its own state, tunnel subnet and
// egress address and the same token (imported); one load generator in cn
// gives every job all three (airlock-testpeer jobs -gateway a,b,c), so
// each job joins the least loaded with airlock run's own choice
// (client.Rank) and fails over as airlock run does (after
// -scale.failover without its gateway). Recorded: the spread after the
// start; then the gateway with the most jobs is killed with SIGKILL and
// every job probes until its echo comes back through a gateway: the
// latencies of the killed gateway's jobs (p50/p99/max from the kill),
// and the spread afterwards.

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/loadgen"
	"github.com/airlock-vpn/airlock/test/topology"
)

var (
	flagScaleGateways = flag.Int("scale.gateways", 1, "with 3: the several-gateways phase only (-scale.n jobs spread over three gateways, one killed); 1: the single-gateway phases")
	flagScaleFailover = flag.Duration("scale.failover", 0, "several gateways: the jobs' failover threshold (0: airlock run's default, 10 s)")
)

// gatewaysPhase is the several-gateways phase's result.
type gatewaysPhase struct {
	Phase string
	N     int
	// Load is /proc/loadavg's 1-minute figure at the end of the phase.
	Load float64
	// Spread is running jobs per gateway (control address).
	Spread map[string]int
	// Killed is the gateway killed (SIGKILL) and KilledJobs its jobs.
	Killed     string `json:",omitempty"`
	KilledJobs int    `json:",omitempty"`
	// Recover is how long the killed gateway's jobs took, from the kill,
	// until an echo came back through another gateway.
	Recover loadgen.Summary
	Report  loadgen.Report
	Note    string `json:",omitempty"`
}

// scaleGateways runs the several-gateways phase; results go to out.
func scaleGateways(t *testing.T, out string) {
	var phases []gatewaysPhase
	save := func() {
		b, _ := json.MarshalIndent(phases, "", "  ")
		if err := os.WriteFile(filepath.Join(out, "results.json"), b, 0o644); err != nil {
			t.Error(err)
		}
	}
	defer save()
	if *flagScaleGateways != 3 {
		t.Fatalf("-scale.gateways %d: the topology has three gateway hosts; want 3", *flagScaleGateways)
	}
	tp := topology.New(t, topology.WithPrefix("sg"), topology.WithThirdDMZ())
	u := topology.EnsureUser(t)
	airlock, peer := topology.BuildAirlock(t), topology.BuildPeer(t)
	// The echo server binds inet's address itself: one on 0.0.0.0 would
	// answer dmz2 and dmz3 from inet's address on their links, which
	// their gateways' sockets (connected to the address asked) drop.
	echo := netip.AddrPortFrom(tp.INETAddr, uint16(tp.Port()))
	ep := tp.Start(t, tp.INET, nil, peer, "udpecho", echo.String())
	if !topology.PollEvery(30*time.Second, 100*time.Millisecond, func() bool {
		code, _, _ := tp.Run(t, 5*time.Second, tp.INET, nil, peer, "udpclient", echo.String(), "1")
		return code == 0
	}) {
		t.Fatalf("udp echo not answering: %s", ep.Describe())
	}
	base := topology.TempDir(t)
	if err := os.Chown(base, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	hosts := []struct {
		ns     string
		listen netip.Addr
	}{{tp.DMZ, tp.DMZAddrCN}, {tp.DMZ2, topology.DMZ2AddrCN}, {tp.DMZ3, topology.DMZ3AddrCN}}
	type gateway struct {
		ns, state, addr, pin string
		proc                 *topology.Process
	}
	// No per-token join quota: the storm is N joins in -scale.over, far
	// over the default 600 a minute per gateway.
	conf := filepath.Join(base, "gateway.toml")
	if err := os.WriteFile(conf, []byte("version = 1\n[quota.job]\njoins_per_minute = 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var gws []*gateway
	tok := ""
	for i, h := range hosts {
		if *flagScalePorts != "" {
			if code, o, e := tp.Run(t, 10*time.Second, h.ns, nil, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range="+*flagScalePorts); code != 0 {
				t.Fatalf("sysctl ip_local_port_range in %s: %s %s", h.ns, o, e)
			}
		}
		g := &gateway{ns: h.ns, state: filepath.Join(base, fmt.Sprintf("state-%d", i))}
		args := []string{"gateway", "--state", g.state, "--listen", netip.AddrPortFrom(h.listen, 8443).String(),
			"--subnet", fmt.Sprintf("100.%d.0.0/16", 64+i), "--block-size", strconv.Itoa(*flagScaleBlock), "--flow-log", "off", "--config", conf}
		if *flagScaleGwArgs != "" {
			args = append(args, strings.Fields(*flagScaleGwArgs)...)
		}
		g.proc = tp.Start(t, h.ns, u, airlock, args...)
		if !topology.Poll(60*time.Second, func() bool {
			if b, err := os.ReadFile(filepath.Join(g.state, "join.env")); err == nil && strings.Contains(string(b), "AIRLOCK_PIN=") {
				for _, l := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(l, "AIRLOCK_GATEWAY="); ok {
						g.addr = v
					}
					if v, ok := strings.CutPrefix(l, "AIRLOCK_PIN="); ok {
						g.pin = v
					}
				}
				return true
			}
			ok, _ := g.proc.Exited()
			return ok
		}) || g.pin == "" {
			t.Fatalf("gateway %d not ready: %s", i, g.proc.Describe())
		}
		if i == 0 {
			code, o, e := tp.Run(t, 30*time.Second, h.ns, u, airlock, "token", "create", "--state", g.state, "--name", "scale", "--ttl", "24h")
			if code != 0 {
				t.Fatalf("token create: %s %s", o, e)
			}
			tok = strings.TrimSpace(o)
		} else {
			code, o, e := tp.Run(t, 30*time.Second, h.ns, u, "bash", "-c",
				fmt.Sprintf("printf %%s %q | %s token create --state %s --name scale --import", tok, airlock, g.state))
			if code != 0 {
				t.Fatalf("token import on gateway %d: %s %s", i, o, e)
			}
		}
		gws = append(gws, g)
	}
	var addrs, pins []string
	for _, g := range gws {
		addrs = append(addrs, g.addr)
		pins = append(pins, g.pin)
	}
	n := *flagScaleN
	args := []string{"jobs", "-gateway", strings.Join(addrs, ","), "-pin", strings.Join(pins, ","), "-token", tok,
		"-n", strconv.Itoa(n), "-over", flagScaleOver.String(), "-hold", "10h", "-echo", echo.String(), "-echo-every", "0",
		"-timeout", "20s", "-prefix", "gws", "-probe-limit", "2m"}
	if *flagScaleFailover > 0 {
		args = append(args, "-failover-after", flagScaleFailover.String())
	}
	gen := tp.Start(t, tp.CN, nil, peer, args...)
	defer gen.Kill()
	r, ok := genReport(gen, "start", 20*time.Minute)
	if !ok {
		t.Fatalf("start: no report: %s", tailStr(gen.Stderr(), 2000))
	}
	start := gatewaysPhase{Phase: "gateways-start", N: n, Load: loadAvg(), Spread: r.Gateways, Report: r}
	phases = append(phases, start)
	save()
	t.Logf("%d jobs over %d gateways started in %.1f s: ok %d failed %d; join p50 %.0f p99 %.0f max %.0f ms; handshake p99 %.0f ms; spread %v; load %.2f; errors %v",
		n, len(gws), r.Seconds, r.OK, r.Failed, r.Join.P50, r.Join.P99, r.Join.Max, r.Handshake.P99, spreadStr(r.Gateways, addrs), start.Load, r.Errors)

	// Kill the busiest gateway; every job probes from the kill on.
	time.Sleep(3 * time.Second)
	victim := gws[0]
	for _, g := range gws {
		if r.Gateways[g.addr] > r.Gateways[victim.addr] {
			victim = g
		}
	}
	victim.proc.Kill()
	_ = gen.Signal(syscall.SIGUSR1)
	pr := waitNth(gen, "probe", 1, 10*time.Minute)
	_ = gen.Signal(syscall.SIGUSR2)
	after := waitNth(gen, "snapshot", 1, time.Minute)
	kill := gatewaysPhase{Phase: "gateways-kill", N: r.OK, Load: loadAvg(), Spread: after.Gateways, Killed: victim.addr,
		KilledJobs: r.Gateways[victim.addr], Recover: pr.ProbeByGateway[victim.addr], Report: pr,
		Note: fmt.Sprintf("failover threshold %v (airlock run --failover-after); latencies count from the SIGKILL", failoverOf(*flagScaleFailover))}
	phases = append(phases, kill)
	save()
	t.Logf("killed %s with %d jobs: its jobs flowing again through the others: %d of %d, p50 %.0f p99 %.0f max %.0f ms after the kill (failover threshold %v); all jobs: ok %d failed %d; spread after %v; failovers %d; load %.2f",
		victim.addr, kill.KilledJobs, kill.Recover.N, kill.KilledJobs, kill.Recover.P50, kill.Recover.P99, kill.Recover.Max, failoverOf(*flagScaleFailover),
		pr.OK, pr.Failed, spreadStr(after.Gateways, addrs), after.Failovers, kill.Load)
	for _, g := range gws {
		if w := warnings(g.proc.Stderr()); w != "" {
			t.Logf("gateway %s warnings: %s", g.addr, tailStr(w, 1500))
		}
	}
	_ = gen.Signal(syscall.SIGTERM)
	end, _ := genReport(gen, "end", 5*time.Minute)
	phases = append(phases, gatewaysPhase{Phase: "end", N: r.OK, Load: loadAvg(), Spread: end.Gateways, Report: end})
	save()
	if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		_ = os.WriteFile(filepath.Join(out, "commit"), b, 0o644)
	}
}

// warnings returns the WARN and ERROR lines of a gateway's log.
func warnings(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func failoverOf(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return 10 * time.Second
}

// spreadStr formats jobs per gateway in the order of addrs.
func spreadStr(m map[string]int, addrs []string) string {
	var parts []string
	for _, a := range addrs {
		parts = append(parts, fmt.Sprintf("%s=%d", a, m[a]))
	}
	var extra []string
	for a, n := range m {
		found := false
		for _, b := range addrs {
			found = found || a == b
		}
		if !found {
			extra = append(extra, fmt.Sprintf("%s=%d", a, n))
		}
	}
	sort.Strings(extra)
	return strings.Join(append(parts, extra...), " ")
}
