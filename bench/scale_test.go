// SPDX-License-Identifier: MIT

package bench

// Theory of operation: TestScaleBench measures one user-mode gateway at
// site scale with the load generator (airlock-testpeer jobs, test/loadgen:
// N simulated jobs in one process in cn, each with a real join, WireGuard
// handshake, lease watch, renewals and a UDP echo through its tunnel to a
// server in inet). Phases, each written to results.json with the load
// average of the machine beside it (the machine is shared):
//
//  1. storm: N jobs started evenly within -scale.over; join, handshake
//     and first-echo latency per job; gateway RSS before and after;
//  2. idle: the jobs renew, watch and keep alive for -scale.idle; the
//     gateway's CPU time over that window and its RSS per job;
//  3. restart: the gateway is stopped (SIGTERM, leases stay in its state
//     db) and started again; every job probes until its echo comes back
//     (time from the restart's start);
//  4. ramp: the jobs are released and larger N (-scale.ramp) are started
//     in turn until a step fails; what failed and why is recorded.
//
// With -scale.gateways 3 it runs instead the several-gateways phase
// (scale_gateways_test.go): -scale.n jobs spread over three gateways by
// the clients' least-loaded choice, then one gateway killed.

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/loadgen"
	"github.com/airlock-vpn/airlock/test/topology"
)

var (
	flagScaleN       = flag.Int("scale.n", 2000, "jobs of the storm, idle and restart phases")
	flagScaleOver    = flag.Duration("scale.over", 10*time.Second, "the storm's jobs start within this long")
	flagScaleIdle    = flag.Duration("scale.idle", 60*time.Second, "idle window for CPU per job")
	flagScaleRamp    = flag.String("scale.ramp", "4000,6000,8000,10000", "larger job counts to try after the main phases (empty: none)")
	flagScaleBlock   = flag.Int("scale.block", 16, "--block-size of the gateway")
	flagScaleGwArgs  = flag.String("scale.gwargs", "", "extra gateway arguments, space-separated")
	flagScaleNoFile  = flag.Uint64("scale.nofile", 0, "RLIMIT_NOFILE for the gateway and generator (0: inherit this machine's)")
	flagScalePorts   = flag.String("scale.localports", "1024 65535", "net.ipv4.ip_local_port_range in dmz (user mode takes blocks from it)")
	flagScaleRestart = flag.Bool("scale.restart", true, "measure a gateway restart with the live jobs")
	flagScaleRate    = flag.Int("scale.ramprate", 50, "ramp steps start this many jobs per second")
	flagScalePprof   = flag.Bool("scale.pprof", false, "write the gateway's CPU profile of the storm and its heap and goroutine profiles after the idle phase (admin socket, /debug/pprof) into the run directory")
)

// scalePhase is one measured phase.
type scalePhase struct {
	Phase string
	N     int
	// Load is /proc/loadavg's 1-minute figure at the end of the phase.
	Load   float64
	Report loadgen.Report
	// Gateway resident memory (KiB) and CPU seconds at the end.
	GwRSSKiB   int64
	GwCPU      float64
	RSSPerJob  float64 `json:",omitempty"` // KiB
	CPUPerJob  float64 `json:",omitempty"` // % of one core per job
	Seconds    float64 `json:",omitempty"`
	Note       string  `json:",omitempty"`
	GenRSSKiB  int64   `json:",omitempty"`
	GatewayFDs int     `json:",omitempty"`
}

func TestScaleBench(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH_SCALE") != "1" {
		t.Skip("scale benchmark: set AIRLOCK_BENCH_SCALE=1 and run as root (bench/README.md, \"Scale\")")
	}
	topology.RequireRoot(t)
	out := *flagOut
	if out == "" {
		out = filepath.Join("results", "scale-"+time.Now().UTC().Format("2006-01-02T150405"))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if *flagScaleNoFile > 0 {
		lim := unix.Rlimit{Cur: *flagScaleNoFile, Max: *flagScaleNoFile}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("setrlimit nofile %d: %v", *flagScaleNoFile, err)
		}
	}
	if *flagScaleGateways > 1 {
		scaleGateways(t, out)
		return
	}
	var phases []scalePhase
	save := func() {
		b, _ := json.MarshalIndent(phases, "", "  ")
		if err := os.WriteFile(filepath.Join(out, "results.json"), b, 0o644); err != nil {
			t.Error(err)
		}
	}
	defer save()

	tp := topology.New(t, topology.WithPrefix("sc"))
	u := topology.EnsureUser(t)
	airlock, peer := topology.BuildAirlock(t), topology.BuildPeer(t)
	if *flagScalePorts != "" {
		if code, o, e := tp.Run(t, 10*time.Second, tp.DMZ, nil, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range="+*flagScalePorts); code != 0 {
			t.Fatalf("sysctl ip_local_port_range: %s %s", o, e)
		}
	}
	echo := netip.AddrPortFrom(tp.INETAddr, uint16(tp.StartUDPEcho(t)))
	base := topology.TempDir(t)
	if err := os.Chown(base, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(base, "state")
	gwArgs := []string{"gateway", "--state", state, "--listen", netip.AddrPortFrom(tp.DMZAddrCN, 8443).String(),
		"--block-size", strconv.Itoa(*flagScaleBlock), "--flow-log", "off"}
	if *flagScaleGwArgs != "" {
		gwArgs = append(gwArgs, strings.Fields(*flagScaleGwArgs)...)
	}
	var gw *topology.Process
	startGW := func() time.Duration {
		t0 := time.Now()
		_ = os.Remove(filepath.Join(state, "join.env"))
		gw = tp.Start(t, tp.DMZ, u, airlock, gwArgs...)
		for {
			if b, err := os.ReadFile(filepath.Join(state, "join.env")); err == nil && strings.Contains(string(b), "AIRLOCK_PIN=") {
				return time.Since(t0)
			}
			if ok, _ := gw.Exited(); ok {
				t.Fatalf("gateway exited: %s", gw.Describe())
			}
			if time.Since(t0) > 60*time.Second {
				t.Fatalf("gateway not ready in 60 s: %s", gw.Describe())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	startGW()
	env, err := os.ReadFile(filepath.Join(state, "join.env"))
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]string{}
	for _, l := range strings.Split(string(env), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			vals[k] = v
		}
	}
	code, tok, stderr := tp.Run(t, 30*time.Second, tp.DMZ, u, airlock, "token", "create", "--state", state, "--name", "scale", "--ttl", "24h")
	if code != 0 {
		t.Fatalf("token create: %s", stderr)
	}
	tok = strings.TrimSpace(tok)
	t.Logf("gateway: %s", firstMatch(gw.Stderr(), "capacity"))

	gwPID := func() int { return gw.Cmd.Process.Pid }
	startGen := func(n int, over time.Duration, prefix string) *topology.Process {
		return tp.Start(t, tp.CN, nil, peer, "jobs", "-gateway", vals["AIRLOCK_GATEWAY"], "-pin", vals["AIRLOCK_PIN"], "-token", tok,
			"-n", strconv.Itoa(n), "-over", over.String(), "-hold", "10h", "-echo", echo.String(), "-echo-every", "0",
			"-timeout", "20s", "-prefix", prefix)
	}
	measure := func(p scalePhase, gen *topology.Process) scalePhase {
		p.Load = loadAvg()
		p.GwRSSKiB = rssKiB(gwPID())
		p.GwCPU = procCPU(gwPID())
		p.GatewayFDs = countFDs(gwPID())
		if gen != nil {
			p.GenRSSKiB = rssKiB(gen.Cmd.Process.Pid)
		}
		return p
	}

	time.Sleep(2 * time.Second)
	before := measure(scalePhase{Phase: "baseline"}, nil)
	phases = append(phases, before)
	t.Logf("baseline: gateway RSS %d KiB, load %.2f", before.GwRSSKiB, before.Load)

	// 1. Storm.
	n := *flagScaleN
	cpu0 := procCPU(gwPID())
	profDone := make(chan error, 1)
	if *flagScalePprof {
		secs := int((*flagScaleOver + 5*time.Second).Seconds())
		go func() {
			profDone <- adminProfile(state, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), filepath.Join(out, "storm.cpu.pprof"), time.Duration(secs+30)*time.Second)
		}()
	} else {
		close(profDone)
	}
	gen := startGen(n, *flagScaleOver, "storm")
	r, ok := genReport(gen, "start", 10*time.Minute)
	if !ok {
		t.Fatalf("storm: no report: %s", tailStr(gen.Stderr(), 2000))
	}
	time.Sleep(5 * time.Second)
	if err := <-profDone; err != nil {
		t.Logf("storm CPU profile: %v", err)
	}
	storm := measure(scalePhase{Phase: "storm", N: n, Report: r, Seconds: r.Seconds}, gen)
	storm.RSSPerJob = float64(storm.GwRSSKiB-before.GwRSSKiB) / float64(max(r.OK, 1))
	storm.Note = fmt.Sprintf("gateway CPU during the storm %.2f s, %.2f ms per job (join, TLS, WireGuard handshake, first echo)",
		storm.GwCPU-cpu0, (storm.GwCPU-cpu0)*1000/float64(max(r.OK, 1)))
	phases = append(phases, storm)
	save()
	t.Logf("%s", storm.Note)
	t.Logf("storm %d jobs in %v: ok %d failed %d; join p50 %.0f p99 %.0f max %.0f ms; handshake p50 %.0f p99 %.0f max %.0f ms; echo p50 %.0f p99 %.0f ms; gw RSS %d KiB (%.1f KiB/job), load %.2f; errors %v",
		n, *flagScaleOver, r.OK, r.Failed, r.Join.P50, r.Join.P99, r.Join.Max, r.Handshake.P50, r.Handshake.P99, r.Handshake.Max, r.Echo.P50, r.Echo.P99,
		storm.GwRSSKiB, storm.RSSPerJob, storm.Load, r.Errors)

	// 2. Idle.
	c0 := procCPU(gwPID())
	t0 := time.Now()
	time.Sleep(*flagScaleIdle)
	win := time.Since(t0).Seconds()
	idle := measure(scalePhase{Phase: "idle", N: r.OK, Seconds: win}, gen)
	idle.RSSPerJob = float64(idle.GwRSSKiB-before.GwRSSKiB) / float64(max(r.OK, 1))
	idle.CPUPerJob = (idle.GwCPU - c0) / win * 100 / float64(max(r.OK, 1))
	if *flagScalePprof {
		for _, p := range []string{"heap", "goroutine"} {
			if err := adminProfile(state, "/debug/pprof/"+p, filepath.Join(out, "idle."+p+".pprof"), time.Minute); err != nil {
				t.Logf("idle %s profile: %v", p, err)
			}
		}
	}
	_ = gen.Signal(syscall.SIGUSR1)
	pr, _ := genReport(gen, "probe", 3*time.Minute)
	idle.Report = pr
	phases = append(phases, idle)
	save()
	t.Logf("idle %d jobs for %.0f s: gateway CPU %.2f s (%.5f %% of a core per job), RSS %d KiB (%.1f KiB/job), fds %d; probe ok %d failed %d; load %.2f",
		r.OK, win, idle.GwCPU-c0, idle.CPUPerJob, idle.GwRSSKiB, idle.RSSPerJob, idle.GatewayFDs, pr.OK, pr.Failed, idle.Load)

	// 3. Restart.
	if *flagScaleRestart {
		t0 := time.Now()
		_ = gw.Signal(syscall.SIGTERM)
		if _, err := gw.Wait(30 * time.Second); err != nil {
			t.Fatalf("gateway did not stop: %v", err)
		}
		stop := time.Since(t0)
		ready := startGW()
		_ = gen.Signal(syscall.SIGUSR1)
		// The first probe report is the idle phase's; wait for the second.
		pr := waitNth(gen, "probe", 2, 5*time.Minute)
		rs := measure(scalePhase{Phase: "restart", N: r.OK, Report: pr, Seconds: time.Since(t0).Seconds(),
			Note: fmt.Sprintf("stop %.2f s, start until join.env %.2f s; probe latencies count from the restarted gateway's start", stop.Seconds(), ready.Seconds())}, gen)
		phases = append(phases, rs)
		save()
		t.Logf("restart with %d leases: stop %v, ready %v; every job flowing again: ok %d failed %d, p50 %.0f p99 %.0f max %.0f ms after start; load %.2f",
			r.OK, stop.Round(time.Millisecond), ready.Round(time.Millisecond), pr.OK, pr.Failed, pr.Echo.P50, pr.Echo.P99, pr.Echo.Max, rs.Load)
	}
	_ = gen.Signal(syscall.SIGTERM)
	end, _ := genReport(gen, "end", 5*time.Minute)
	phases = append(phases, measure(scalePhase{Phase: "end", N: r.OK, Report: end}, nil))
	save()

	// 4. Ramp.
	for _, f := range strings.Split(*flagScaleRamp, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			continue
		}
		time.Sleep(3 * time.Second)
		b := measure(scalePhase{}, nil)
		over := time.Duration(n / max(*flagScaleRate, 1) * int(time.Second))
		// One generator process per genJobs jobs: each holds about three
		// descriptors per job, and RLIMIT_NOFILE may not be raisable.
		k := (n + genJobs - 1) / genJobs
		var gens []*topology.Process
		for i := 0; i < k; i++ {
			gens = append(gens, startGen(n/k, over, fmt.Sprintf("ramp%d-%d", n, i)))
		}
		var r loadgen.Report
		ok := true
		var genRSS int64
		for _, gen := range gens {
			gr, gok := genReport(gen, "start", 20*time.Minute)
			ok = ok && gok
			r = mergeReports(r, gr, len(gens))
			genRSS += rssKiB(gen.Cmd.Process.Pid)
		}
		gen := gens[0]
		p := measure(scalePhase{Phase: "ramp", N: n, Report: r, Seconds: r.Seconds}, nil)
		p.GenRSSKiB = genRSS
		p.RSSPerJob = float64(p.GwRSSKiB-b.GwRSSKiB) / float64(max(r.OK, 1))
		if k > 1 {
			p.Note = fmt.Sprintf("%d generator processes of %d jobs; join/handshake p50 is their mean, p99 and max their maximum", k, n/k)
		}
		if !ok {
			p.Note += " no report from a generator: " + tailStr(gen.Stderr(), 500)
		}
		if ex, _ := gw.Exited(); ex {
			p.Note += " gateway exited: " + tailStr(gw.Stderr(), 1000)
		}
		phases = append(phases, p)
		save()
		t.Logf("ramp %d jobs over %v: ok %d failed %d; join p50 %.0f p99 %.0f ms; hs p99 %.0f ms; gw RSS %d KiB (%.1f KiB/job) fds %d, generator RSS %d KiB; load %.2f; errors %v %s",
			n, over, r.OK, r.Failed, r.Join.P50, r.Join.P99, r.Handshake.P99, p.GwRSSKiB, p.RSSPerJob, p.GatewayFDs, p.GenRSSKiB, p.Load, r.Errors, p.Note)
		for _, gen := range gens {
			_ = gen.Signal(syscall.SIGTERM)
		}
		for _, gen := range gens {
			genReport(gen, "end", 5*time.Minute)
			gen.Kill()
		}
		if !ok || r.Failed > 0 {
			break
		}
	}
	t.Logf("gateway log (warnings): %s", tailStr(gw.Stderr(), 3000))
	if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		_ = os.WriteFile(filepath.Join(out, "commit"), b, 0o644)
	}
}

// genJobs is how many jobs one generator process runs in the ramp.
const genJobs = 4000

// mergeReports adds b, one of n generators' reports, to a: counts and
// errors add up, p50s average, p99s and maxima take the larger.
func mergeReports(a, b loadgen.Report, n int) loadgen.Report {
	a.Phase, a.Jobs, a.OK, a.Failed = b.Phase, a.Jobs+b.Jobs, a.OK+b.OK, a.Failed+b.Failed
	a.Seconds = max(a.Seconds, b.Seconds)
	m := func(x, y loadgen.Summary) loadgen.Summary {
		return loadgen.Summary{N: x.N + y.N, P50: x.P50 + y.P50/float64(n), P90: max(x.P90, y.P90), P99: max(x.P99, y.P99), Max: max(x.Max, y.Max)}
	}
	a.Join, a.Handshake, a.Echo = m(a.Join, b.Join), m(a.Handshake, b.Handshake), m(a.Echo, b.Echo)
	for k, v := range b.Errors {
		if a.Errors == nil {
			a.Errors = map[string]int{}
		}
		a.Errors[k] += v
	}
	return a
}

// genReport waits for the generator's first report of phase.
func genReport(p *topology.Process, phase string, timeout time.Duration) (loadgen.Report, bool) {
	r := waitNth(p, phase, 1, timeout)
	return r, r.Phase == phase
}

// waitNth waits for the generator's nth report of phase; the zero Report
// if it does not come within timeout or the generator exits.
func waitNth(p *topology.Process, phase string, nth int, timeout time.Duration) loadgen.Report {
	deadline := time.Now().Add(timeout)
	for {
		exited, _ := p.Exited()
		seen := 0
		for _, l := range strings.Split(p.Stdout(), "\n") {
			var r loadgen.Report
			if json.Unmarshal([]byte(l), &r) == nil && r.Phase == phase {
				seen++
				if seen == nth {
					return r
				}
			}
		}
		if exited || time.Now().After(deadline) {
			return loadgen.Report{}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func loadAvg() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func rssKiB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func countFDs(pid int) int {
	es, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	return len(es)
}

func firstMatch(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

func tailStr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
