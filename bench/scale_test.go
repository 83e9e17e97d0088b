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
	flagScaleIdle    = flag.Duration("scale.idle", 5*time.Minute, "idle window for CPU and memory per job (longer than the gateway's UDP idle timeout, 60 s, so that the first echoes' flows have ended, and than two of the Go runtime's periodic collections, so that their buffers are released)")
	flagScaleRamp    = flag.String("scale.ramp", "4000,6000,8000,10000", "larger job counts to try after the main phases (empty: none)")
	flagScaleBlock   = flag.Int("scale.block", 16, "--block-size of the gateway")
	flagScaleGwArgs  = flag.String("scale.gwargs", "", "extra gateway arguments, space-separated")
	flagScaleNoFile  = flag.Uint64("scale.nofile", 0, "RLIMIT_NOFILE for the gateway and generator (0: inherit this machine's)")
	flagScalePorts   = flag.String("scale.localports", "1024 65535", "net.ipv4.ip_local_port_range in dmz (user mode takes blocks from it)")
	flagScaleRestart = flag.String("scale.restart", "term,kill", "gateway restarts with the live jobs, in turn: term (SIGTERM, a clean stop) and kill (SIGKILL, a crash, once the gateway saved every job's endpoint); empty: none")
	flagScaleRate    = flag.Int("scale.ramprate", 50, "ramp steps start this many jobs per second")
	flagScaleAirlock = flag.String("scale.airlock", "", "airlock binary of the gateway (default: this tree's build), to measure another version with the same load generator")
	flagScalePprof   = flag.Bool("scale.pprof", false, "write the gateway's CPU profiles of the storm and of the first probe's first 20 s, and its heap and goroutine profiles after the idle phase (admin socket, /debug/pprof) into the run directory")
)

// scalePhase is one measured phase.
type scalePhase struct {
	Phase string
	N     int
	// Load is /proc/loadavg's 1-minute figure at the end of the phase.
	Load   float64
	Report loadgen.Report
	// Gateway resident memory (KiB) and CPU seconds at the end.
	GwRSSKiB int64
	GwCPU    float64
	// The gateway's Go heap in use and goroutine stacks (KiB) at the end
	// (runtime.MemStats HeapInuse, StackInuse, from its admin socket),
	// beside the resident memory an admin sees.
	GwHeapKiB  int64 `json:",omitempty"`
	GwStackKiB int64 `json:",omitempty"`
	// HeapPerJob and StackPerJob are GwHeapKiB and GwStackKiB above the
	// empty gateway's, per job (KiB).
	HeapPerJob  float64 `json:",omitempty"`
	StackPerJob float64 `json:",omitempty"`
	RSSPerJob   float64 `json:",omitempty"` // KiB
	CPUPerJob   float64 `json:",omitempty"` // % of one core per job
	Seconds     float64 `json:",omitempty"`
	Note        string  `json:",omitempty"`
	GenRSSKiB   int64   `json:",omitempty"`
	GatewayFDs  int     `json:",omitempty"`
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
	if *flagScaleAirlock != "" {
		airlock = *flagScaleAirlock // another version's gateway, for an A/B
	}
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
		ready := func() bool {
			b, err := os.ReadFile(filepath.Join(state, "join.env"))
			return err == nil && strings.Contains(string(b), "AIRLOCK_PIN=")
		}
		if !topology.Poll(60*time.Second, func() bool { ok, _ := gw.Exited(); return ready() || ok }) || !ready() {
			t.Fatalf("gateway not ready in 60 s: %s", gw.Describe())
		}
		return time.Since(t0)
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
	// startGens starts n jobs over over in one generator process per
	// genJobs jobs (each holds about three descriptors per job, and
	// RLIMIT_NOFILE may not be raisable).
	startGens := func(n int, over time.Duration, prefix string) genSet {
		k := (n + genJobs - 1) / genJobs
		var gs genSet
		for i := 0; i < k; i++ {
			m := n / k
			if i == k-1 {
				m = n - (k-1)*(n/k)
			}
			gs = append(gs, startGen(m, over, fmt.Sprintf("%s-%d", prefix, i)))
		}
		return gs
	}
	measure := func(p scalePhase, gs genSet) scalePhase {
		p.Load = loadAvg()
		p.GwRSSKiB = rssKiB(gwPID())
		p.GwCPU = procCPU(gwPID())
		p.GatewayFDs = countFDs(gwPID())
		p.GenRSSKiB = gs.rss()
		p.GwHeapKiB, p.GwStackKiB = gatewayMemStats(state)
		return p
	}
	perJob := func(p *scalePhase, base scalePhase, jobs int) {
		n := float64(max(jobs, 1))
		p.RSSPerJob = float64(p.GwRSSKiB-base.GwRSSKiB) / n
		p.HeapPerJob = float64(p.GwHeapKiB-base.GwHeapKiB) / n
		p.StackPerJob = float64(p.GwStackKiB-base.GwStackKiB) / n
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
	gen := startGens(n, *flagScaleOver, "storm")
	r, ok := gen.report("start", 1, 20*time.Minute)
	if !ok {
		t.Fatalf("storm: no report: %s", tailStr(gen[0].Stderr(), 2000))
	}
	time.Sleep(5 * time.Second)
	if err := <-profDone; err != nil {
		t.Logf("storm CPU profile: %v", err)
	}
	storm := measure(scalePhase{Phase: "storm", N: n, Report: r, Seconds: r.Seconds}, gen)
	perJob(&storm, before, r.OK)
	storm.Note = fmt.Sprintf("gateway CPU during the storm %.2f s, %.2f ms per job (join, TLS, WireGuard handshake, first echo); %d generator processes",
		storm.GwCPU-cpu0, (storm.GwCPU-cpu0)*1000/float64(max(r.OK, 1)), len(gen))
	phases = append(phases, storm)
	save()
	t.Logf("%s", storm.Note)
	t.Logf("storm %d jobs in %v: ok %d failed %d; join p50 %.0f p99 %.0f max %.0f ms; handshake p50 %.0f p99 %.0f max %.0f ms; echo p50 %.0f p99 %.0f ms; gw RSS %d KiB (%.1f KiB/job), heap %.1f KiB/job, stacks %.1f KiB/job (5 s after the storm), load %.2f; errors %v",
		n, *flagScaleOver, r.OK, r.Failed, r.Join.P50, r.Join.P99, r.Join.Max, r.Handshake.P50, r.Handshake.P99, r.Handshake.Max, r.Echo.P50, r.Echo.P99,
		storm.GwRSSKiB, storm.RSSPerJob, storm.HeapPerJob, storm.StackPerJob, storm.Load, r.Errors)

	// 2. Idle: the jobs renew and keep their sessions; their first echo's
	// UDP flow ends after the gateway's UDP idle timeout (60 s), so a
	// window of more than that measures idle jobs.
	c0 := procCPU(gwPID())
	t0 := time.Now()
	// The resident memory every 30 s of the window: it falls once the Go
	// runtime's periodic collections (every 2 min) have emptied the pools
	// that the storm's flows filled.
	var samples []string
	for time.Since(t0) < *flagScaleIdle {
		time.Sleep(min(30*time.Second, *flagScaleIdle-time.Since(t0)))
		samples = append(samples, fmt.Sprintf("%.0fs:%.1f", time.Since(t0).Seconds(),
			float64(rssKiB(gwPID())-before.GwRSSKiB)/float64(max(r.OK, 1))))
	}
	win := time.Since(t0).Seconds()
	idle := measure(scalePhase{Phase: "idle", N: r.OK, Seconds: win}, gen)
	idle.Note = "resident KiB per job above the empty gateway during the window: " + strings.Join(samples, " ")
	perJob(&idle, before, r.OK)
	idle.CPUPerJob = (idle.GwCPU - c0) / win * 100 / float64(max(r.OK, 1))
	if *flagScalePprof {
		for _, p := range []string{"heap", "goroutine"} {
			if err := adminProfile(state, "/debug/pprof/"+p, filepath.Join(out, "idle."+p+".pprof"), time.Minute); err != nil {
				t.Logf("idle %s profile: %v", p, err)
			}
		}
	}
	probeProf := make(chan error, 1)
	if *flagScalePprof {
		go func() {
			probeProf <- adminProfile(state, "/debug/pprof/profile?seconds=20", filepath.Join(out, "probe.cpu.pprof"), time.Minute)
		}()
	} else {
		close(probeProf)
	}
	gen.signal(syscall.SIGUSR1)
	pr, _ := gen.report("probe", 1, 5*time.Minute)
	if err := <-probeProf; err != nil {
		t.Logf("probe CPU profile: %v", err)
	}
	if pr.Failed > 0 {
		// What the gateway was doing while echoes went unanswered.
		if err := adminProfile(state, "/debug/pprof/goroutine?debug=2", filepath.Join(out, "probe-failed.goroutines.txt"), time.Minute); err != nil {
			t.Logf("goroutines after the failed probe: %v", err)
		}
	}
	gen.signal(syscall.SIGUSR2)
	snap, _ := gen.report("snapshot", 1, time.Minute)
	pr.RenewErrors, pr.WatchErrors = snap.RenewErrors, snap.WatchErrors
	idle.Report = pr
	phases = append(phases, idle)
	save()
	t.Logf("idle %d jobs for %.0f s: gateway CPU %.2f s (%.5f %% of a core per job), RSS %d KiB (%.1f KiB/job), heap %.1f KiB/job, stacks %.1f KiB/job, fds %d; probe ok %d failed %d; renew errors %d, sessions lost %d; load %.2f; %s",
		r.OK, win, idle.GwCPU-c0, idle.CPUPerJob, idle.GwRSSKiB, idle.RSSPerJob, idle.HeapPerJob, idle.StackPerJob, idle.GatewayFDs, pr.OK, pr.Failed, pr.RenewErrors, pr.WatchErrors, idle.Load, idle.Note)

	// 3. Restarts: every job's traffic must flow again (probes from the
	// moment the restarted gateway is ready).
	probes := 1
	for _, how := range strings.Split(*flagScaleRestart, ",") {
		how = strings.TrimSpace(how)
		if how == "" {
			continue
		}
		sig := syscall.SIGTERM
		note := ""
		if how == "kill" {
			sig = syscall.SIGKILL
			// A crash loses the endpoints of the last 15 s: wait until
			// the gateway saved every job's.
			topology.PollEvery(time.Minute, time.Second, func() bool { return endpointCount(state) >= r.OK })
			note = fmt.Sprintf("; %d endpoints saved before the kill", endpointCount(state))
		}
		t0 := time.Now()
		_ = gw.Signal(sig)
		if _, err := gw.Wait(30 * time.Second); err != nil {
			// The Go runtime prints every goroutine on SIGQUIT.
			_ = gw.Signal(syscall.SIGQUIT)
			_, _ = gw.Wait(10 * time.Second)
			_ = os.WriteFile(filepath.Join(out, "stop-stuck.gateway.log"), []byte(gw.Stderr()), 0o644)
			t.Fatalf("gateway did not stop (its goroutines: stop-stuck.gateway.log): %v", err)
		}
		stop := time.Since(t0)
		ready := startGW()
		gen.signal(syscall.SIGUSR1)
		probes++
		pr, _ := gen.report("probe", probes, 5*time.Minute)
		rs := measure(scalePhase{Phase: "restart-" + how, N: r.OK, Report: pr, Seconds: time.Since(t0).Seconds(),
			Note: fmt.Sprintf("%s: stop %.2f s, start until join.env %.2f s; probe latencies count from then%s; %s", sig, stop.Seconds(), ready.Seconds(), note,
				firstMatch(gw.Stderr(), "handshakes with the restored jobs started"))}, gen)
		phases = append(phases, rs)
		save()
		t.Logf("restart (%s) with %d leases: stop %v, ready %v; every job flowing again: ok %d failed %d, p50 %.0f p99 %.0f max %.0f ms after ready; load %.2f%s",
			sig, r.OK, stop.Round(time.Millisecond), ready.Round(time.Millisecond), pr.OK, pr.Failed, pr.Echo.P50, pr.Echo.P99, pr.Echo.Max, rs.Load, note)
	}
	gen.signal(syscall.SIGTERM)
	end, _ := gen.report("end", 1, 5*time.Minute)
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
		gens := startGens(n, over, fmt.Sprintf("ramp%d", n))
		k := len(gens)
		r, ok := gens.report("start", 1, 30*time.Minute)
		genRSS := gens.rss()
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
		gens.signal(syscall.SIGTERM)
		gens.report("end", 1, 5*time.Minute)
		for _, gen := range gens {
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

// genSet is the generator processes of one phase.
type genSet []*topology.Process

// signal sends sig to every generator.
func (gs genSet) signal(sig syscall.Signal) {
	for _, g := range gs {
		_ = g.Signal(sig)
	}
}

// report merges every generator's nth report of phase; false if one did
// not come within timeout.
func (gs genSet) report(phase string, nth int, timeout time.Duration) (loadgen.Report, bool) {
	var r loadgen.Report
	ok := true
	for _, g := range gs {
		gr := waitNth(g, phase, nth, timeout)
		ok = ok && gr.Phase == phase
		r = mergeReports(r, gr, len(gs))
	}
	return r, ok
}

// rss is the generators' resident memory (KiB).
func (gs genSet) rss() int64 {
	var n int64
	for _, g := range gs {
		n += rssKiB(g.Cmd.Process.Pid)
	}
	return n
}

// endpointCount is how many jobs' endpoints the gateway's state saved.
func endpointCount(state string) int {
	b, _ := os.ReadFile(filepath.Join(state, "endpoints"))
	return strings.Count(string(b), "\n")
}

// genJobs is how many jobs one generator process runs.
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
	a.EchoOK, a.EchoFail, a.RenewErrors = a.EchoOK+b.EchoOK, a.EchoFail+b.EchoFail, a.RenewErrors+b.RenewErrors
	a.WatchErrors, a.Restarts, a.Failovers, a.Rejoins = a.WatchErrors+b.WatchErrors, a.Restarts+b.Restarts, a.Failovers+b.Failovers, a.Rejoins+b.Rejoins
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
	var got loadgen.Report
	nthSeen := func() bool {
		seen := 0
		for _, l := range strings.Split(p.Stdout(), "\n") {
			var r loadgen.Report
			if json.Unmarshal([]byte(l), &r) == nil && r.Phase == phase {
				seen++
				if seen == nth {
					got = r
					return true
				}
			}
		}
		return false
	}
	// Once the generator has exited, its whole output is in.
	topology.PollEvery(timeout, 200*time.Millisecond, func() bool { exited, _ := p.Exited(); return nthSeen() || exited })
	return got
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

// gatewayMemStats returns the gateway's HeapInuse and StackInuse (KiB),
// read from its heap profile's text form (its runtime.MemStats: "#
// HeapInuse", "# Stack" in use / from the system) on the
// admin socket of state; zeros if that fails.
func gatewayMemStats(state string) (heap, stack int64) {
	f := filepath.Join(state, "..", "memstats.txt")
	if adminProfile(state, "/debug/pprof/heap?debug=1", f, 30*time.Second) != nil {
		return 0, 0
	}
	b, _ := os.ReadFile(f)
	for _, l := range strings.Split(string(b), "\n") {
		var v int64
		if _, err := fmt.Sscanf(l, "# HeapInuse = %d", &v); err == nil {
			heap = v >> 10
		} else if _, err := fmt.Sscanf(l, "# Stack = %d", &v); err == nil {
			stack = v >> 10
		}
	}
	return heap, stack
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
