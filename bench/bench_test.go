// SPDX-License-Identifier: MIT

package bench

// Theory of operation: TestBench loops over link settings (1 Gbit tbf on
// every veth, uncapped; optionally through the impairment relay). For each
// link it sets up every configuration on a topology of its own, plus one
// topology with native routing, all at once, and warms each up with a
// short iperf3 run each way (discarded; for ocserv-dtls it also proves the
// data goes over UDP). Then it measures in rounds: repetition r of every
// point (streams × direction) of every configuration before repetition
// r+1 of any, configurations interleaved within a point (A B C A B C …), so
// that a slow drift of the machine spreads over all configurations alike.
// Every run of a configuration is followed at once by the same run on the
// native topology, and the row carries both.
//
// The load gate: before every point the machine's busy cores are sampled
// for three seconds from /proc/stat (our own daemons are idle then). Above
// -bench.maxload per core the point is not run (it would be discarded),
// the gate waits and tries again, at most -bench.retries times and at most
// -bench.wait-budget in the whole run; then it runs the point anyway and
// says so loudly in the row's note and the log.
// The 1-minute load average is recorded before and after every point, but
// does not gate: it still carries the previous point's own load for a
// minute.
//
// Each configuration is a stack (stack_test.go, peers_test.go): job(argv)
// wraps an argv to run as the unprivileged test user inside the job's
// network (in cn), and gatewayRoots/clientRoots name the process trees
// whose CPU time (utime+stime from /proc/PID/stat, children included) is
// charged to the gateway and to the client. Every row goes to the run's
// TSV at once (bench/record); bench/report derives tables and plots.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/bench/record"
	"github.com/airlock-vpn/airlock/test/impair"
	"github.com/airlock-vpn/airlock/test/topology"
)

func TestMain(m *testing.M) { topology.Main(m) }

var (
	flagDuration = flag.Int("bench.duration", 10, "iperf3 duration in seconds (also the latency probes')")
	flagReps     = flag.Int("bench.reps", 3, "repetitions of every point, interleaved across configurations")
	flagStreams  = flag.String("bench.streams", "1,10", "parallel stream counts")
	flagConfigs  = flag.String("bench.configs", "native,airlock,airlock-v6,airlock-kernel,ocserv,ocserv-dtls,wireguard-go,openvpn", "throughput configurations (also: airlock-netstack, airlock-tcp, airlock-seccomp, airlock-preload, ocserv-slirp, ocserv-ocproxy, slirp; an airlock configuration with the suffix -v6 runs iperf3 to inet's IPv6 address, against native routing over IPv6)")
	flagLinks    = flag.String("bench.links", "1gbit,uncapped", "link settings: a tc rate, \"uncapped\" or \"jumbo\" (uncapped, the cn–dmz link at MTU 9000, dmz–inet at 1500)")
	flagWAN      = flag.String("bench.wan", "", "impairment profiles between cn and dmz, RTTms-LOSSpercent (e.g. \"10-0,40-0.1\"); empty: none")
	flagCC       = flag.String("bench.cc", "", "TCP congestion control in every namespace of the topologies (e.g. cubic); empty: the host's default")
	flagStartup  = flag.Int("bench.startup", 20, "runs of each start-up measurement (0 skips)")
	flagLatency  = flag.String("bench.latency", "native,airlock,ocserv,ocserv-dtls,wireguard-go,openvpn", "configurations of the latency test (empty: none)")
	flagLatLinks = flag.String("bench.latency-links", "1gbit", "link settings of the latency test (a subset of -bench.links)")
	flagWarmup   = flag.Int("bench.warmup", 3, "seconds of the discarded warm-up run each way per configuration (0: none)")
	flagMaxLoad  = flag.Float64("bench.maxload", 0.25, "load gate: most busy cores per core in the 3 s before a point")
	flagRetries  = flag.Int("bench.retries", 5, "load gate: waits of 20 s before a point runs anyway, flagged")
	flagWaitMax  = flag.Duration("bench.wait-budget", 30*time.Minute, "load gate: total waiting allowed in a run; after it every busy point runs at once, flagged")
	flagMode     = flag.String("bench.mode", record.ModeFull, "full, quick or smoke: written into every row; bench/report quotes only full")
	flagFault    = flag.String("bench.fault", "", "fault injection to test the bench itself: dtls-to-tcp (ocserv-dtls's client stays on TCP; the run must fail loudly)")
	flagOut      = flag.String("bench.out", "", "run directory for logs, meta.tsv and start-up (default results/STAMP)")
	flagTSV      = flag.String("bench.tsv", "", "throughput TSV (default results/STAMP.tsv; latency rows go to …-latency.tsv)")
	flagShim     = flag.String("bench.shim", "", "path of the built fakeroot.so (ocserv-slirp needs it)")
	flagCommit   = flag.String("bench.commit", "", "commit the airlock binary was built from (default: git HEAD)")
	flagBinRevs  = flag.String("bench.bin-commits", "", "the commits of -bench.bins, NAME=COMMIT comma-separated, for the rows of their configurations")
	flagBins     = flag.String("bench.bins", "", "other airlock binaries for A/B runs, NAME=PATH comma-separated: an airlock configuration with the suffix @NAME runs that binary (e.g. -bench.configs airlock,airlock@old -bench.bins old=/tmp/airlock-main)")
)

// commitOf returns the commit of configuration cfg's binary: its @NAME's
// from -bench.bin-commits, else the run's.
func commitOf(cfg, run string) string {
	_, tag, ok := strings.Cut(cfg, "@")
	if !ok {
		return run
	}
	for _, kv := range splitList(*flagBinRevs) {
		if name, rev, ok := strings.Cut(kv, "="); ok && name == tag {
			return rev
		}
	}
	return "unknown"
}

// airlockBin returns the airlock binary of a configuration's @NAME suffix
// (-bench.bins), or the one under test without a suffix.
func airlockBin(t *testing.T, tag string) (string, error) {
	if tag == "" {
		return topology.BuildAirlock(t), nil
	}
	for _, kv := range splitList(*flagBins) {
		if name, path, ok := strings.Cut(kv, "="); ok && name == tag {
			if _, err := os.Stat(path); err != nil {
				return "", fmt.Errorf("-bench.bins %s: %w", tag, err)
			}
			return path, nil
		}
	}
	return "", fmt.Errorf("configuration @%s: no such binary in -bench.bins", tag)
}

// TestBench is the benchmark entry point; see the file comment.
func TestBench(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH") != "1" {
		t.Skip("benchmark: set AIRLOCK_BENCH=1 (and run as root), or use bench/run.sh")
	}
	topology.RequireRoot(t)
	mode := *flagMode
	if mode != record.ModeFull && mode != record.ModeQuick && mode != record.ModeSmoke {
		t.Fatalf("-bench.mode %q: want full, quick or smoke", mode)
	}
	stamp := time.Now().UTC().Format("2006-01-02T150405Z")
	out, tsvPath := *flagOut, *flagTSV
	if out == "" {
		out = filepath.Join("results", stamp)
	}
	if tsvPath == "" {
		tsvPath = filepath.Join("results", stamp+".tsv")
	}
	for _, d := range []string{out, filepath.Dir(tsvPath)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	commit := writeMeta(t, out)
	t.Cleanup(func() {
		if wgBuild.path != "" {
			_ = os.RemoveAll(filepath.Dir(wgBuild.path))
		}
	})
	topology.EnsureUser(t)
	topology.BuildAirlock(t)
	topology.BuildPeer(t)

	streams, err := parseInts(*flagStreams)
	if err != nil {
		t.Fatalf("-bench.streams: %v", err)
	}
	wans := []wanProfile{{}}
	if *flagWAN != "" {
		wans = nil
		for _, w := range splitList(*flagWAN) {
			p, err := parseWAN(w)
			if err != nil {
				t.Fatalf("-bench.wan: %v", err)
			}
			wans = append(wans, p)
		}
	}
	tf, err := os.Create(tsvPath)
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	lf, err := os.Create(strings.TrimSuffix(tsvPath, ".tsv") + "-latency.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	b := &bencher{mode: mode, commit: commit, out: out, rows: record.NewWriter(tf, record.Columns),
		lat: record.NewWriter(lf, record.LatencyColumns), rr: buildRR(t)}
	t.Logf("rows: %s (and %s)", tsvPath, lf.Name())

	for _, rate := range splitList(*flagLinks) {
		for _, wan := range wans {
			link := rate + wan.suffix()
			t.Run(link, func(t *testing.T) { b.runLink(t, rate, wan, streams) })
		}
	}
	if *flagStartup > 0 {
		var startup []startupResult
		for _, s := range []string{"airlock", "ocserv"} {
			if !strings.Contains(*flagConfigs, s) {
				continue
			}
			var res startupResult
			t.Run("startup/"+s, func(t *testing.T) {
				res = benchStartup(t, logDir(filepath.Join(out, "logs", "startup")), s, *flagStartup)
			})
			startup = append(startup, res)
		}
		writeStartup(t, out, startup)
	}
	if b.gaveUp > 0 {
		// Loud, but not a failure: the rows are flagged in the TSV and in
		// every table bench/report makes from it.
		t.Logf("LOAD GATE GAVE UP on %d points: the machine was busy; they are flagged in the TSV and the tables; rerun on a quiet machine", b.gaveUp)
	}
}

// bencher holds what the points of one run share.
type bencher struct {
	mode, commit, out string
	rows, lat         *record.Writer
	rr                string        // the rr probe binary
	gaveUp            int           // points run although the load gate gave up
	waited            time.Duration // by the load gate, in total
}

// linkJumbo is the link setting of an uncapped topology whose node–DMZ
// link carries 9000-byte frames (the outside keeps 1500): Airlock's user
// mode takes a tunnel MTU of 8940 there, wireguard-go is set to 1500, its
// best when the outside carries no more (a larger one only makes dmz send
// cn's TCP ICMP "fragmentation needed").
const linkJumbo = "jumbo"

// target is a configuration's topology with its servers in inet.
type target struct {
	name   string
	v6     bool // iperf3 to inet's IPv6 address (configurations NAME-v6)
	st     stack
	port   int // iperf3
	srvPID int
	rrPort int
	second func(argv ...string) []string // lazily: the latency test's second job
	failed string
}

func (b *bencher) runLink(t *testing.T, rate string, wan wanProfile, streams []int) {
	link := rate + wan.suffix()
	var opts []topology.Option
	switch rate {
	case "uncapped":
	case linkJumbo:
		opts = append(opts, topology.WithLinkMTU(9000))
	default:
		opts = append(opts, topology.WithRate(rate))
	}
	if wan.set {
		opts = append(opts, topology.WithImpairment(impair.Symmetric(wan.rtt, wan.loss/100)))
	}
	if *flagCC != "" {
		opts = append(opts, topology.WithCongestionControl(*flagCC))
	}
	logs := func(cfg string) logDir { return logDir(filepath.Join(b.out, "logs", sanitize(link), cfg)) }
	native := &target{name: "native-baseline", st: &nativeStack{topo: topology.New(t, append(opts, topology.WithNativeRouting(), topology.WithPrefix("bn"))...)}}
	b.servers(t, native, logs("native-baseline"))

	latCfgs := map[string]bool{}
	if contains(splitList(*flagLatLinks), rate) {
		for _, c := range splitList(*flagLatency) {
			latCfgs[c] = true
		}
	}
	var targets []*target
	byName := map[string]*target{}
	for _, cfg := range append(splitList(*flagConfigs), splitList(*flagLatency)...) {
		if byName[cfg] != nil || (!contains(splitList(*flagConfigs), cfg) && !latCfgs[cfg]) {
			continue
		}
		name, tag, _ := strings.Cut(cfg, "@")
		base, v6 := strings.CutSuffix(name, "-v6")
		tg := &target{name: cfg, v6: v6}
		byName[cfg] = tg
		targets = append(targets, tg)
		var st stack
		var err error
		if v6 && !strings.HasPrefix(base, "airlock") {
			err = fmt.Errorf("only airlock configurations have an IPv6 variant")
		} else if tag != "" && !strings.HasPrefix(base, "airlock") {
			err = fmt.Errorf("only airlock configurations take another binary (@%s)", tag)
		} else {
			st, err = newStack(t, base, tag, opts, logs(cfg))
		}
		if err != nil {
			tg.failed = err.Error()
			t.Errorf("%s %s: NOT MEASURED: %v", cfg, link, err)
			b.notMeasured(cfg, link, err.Error())
			continue
		}
		tg.st = st
		b.servers(t, tg, logs(cfg))
	}
	u := topology.EnsureUser(t)

	// Warm-up, discarded: one short run each way per configuration, and on
	// the native topology.
	if *flagWarmup > 0 {
		for _, tg := range append([]*target{native}, targets...) {
			if tg.failed != "" {
				continue
			}
			for _, dir := range []string{"up", "down"} {
				res, _, err := runIperf(t, tg.st.tp(), u, tg.st.job(iperfArgs(tg, 1, dir, *flagWarmup)...), *flagWarmup)
				if err == nil {
					err = tg.st.check(res.bytes)
				}
				if err != nil {
					tg.failed = "warm-up: " + err.Error()
					t.Errorf("%s %s: NOT MEASURED: warm-up %s: %v", tg.name, link, dir, err)
					b.notMeasured(tg.name, link, tg.failed)
					break
				}
				t.Logf("warm-up %-14s %-4s %8.1f Mbit/s (discarded)", tg.name, dir, res.bps/1e6)
			}
		}
	}
	if native.failed != "" {
		t.Fatalf("native baseline failed: %s", native.failed)
	}

	for rep := 1; rep <= *flagReps; rep++ {
		for _, n := range streams {
			for _, dir := range []string{"up", "down"} {
				for _, tg := range targets {
					if tg.failed != "" || !contains(splitList(*flagConfigs), tg.name) {
						continue
					}
					r := b.point(t, tg, native, u, link, n, dir, rep)
					if err := b.rows.Row(r); err != nil {
						t.Fatalf("write row: %v", err)
					}
				}
			}
		}
		for _, tg := range targets {
			if tg.failed != "" || !latCfgs[tg.name] {
				continue
			}
			b.latency(t, tg, native, u, link, rep)
		}
	}
}

func (b *bencher) notMeasured(cfg, link, reason string) {
	_ = b.rows.Row(record.Row{Date: now(), Mode: b.mode, Config: cfg, Commit: commitOf(cfg, b.commit), Link: link,
		GwCPU: -1, ClientCPU: -1, IperfCliCPU: -1, IperfSrvCPU: -1, NatIperfCli: -1, NatIperfSrv: -1, IdleCPU: -1,
		Note: "not measured: " + reason})
}

// servers starts iperf3 -s and rr serve in tg's inet, output to files.
func (b *bencher) servers(t *testing.T, tg *target, logs logDir) {
	tp := tg.st.tp()
	tg.port = tp.Port()
	d := startDaemon(t, tp, logs, "iperf3-server", tp.INET, nil, "", "iperf3", "-s", "--forceflush", "-p", strconv.Itoa(tg.port))
	tg.srvPID = d.pid()
	tg.rrPort = tp.Port()
	r := startDaemon(t, tp, logs, "rr-server", tp.INET, nil, "", b.rr, "serve", "-listen", fmt.Sprintf("%s:%d", tp.INETAddr, tg.rrPort))
	for _, w := range []struct {
		d *daemon
		s string
	}{{d, "Server listening"}, {r, "rr: listening"}} {
		if err := waitUntil(10*time.Second, w.d, func() bool { return w.d.contains(w.s) }); err != nil {
			t.Fatalf("%s server: %v: %s", tg.name, err, w.d.describe())
		}
	}
}

// gate waits until the machine is quiet (see the file comment) and returns
// the 1-minute load average and busy cores of the last window, the CPU
// seconds tg's daemons spent in it, the retries, and whether it gave up.
func (b *bencher) gate(t *testing.T, tg *target, what string) (load1, busy, idle float64, retries int, gaveUp bool) {
	limit := *flagMaxLoad * float64(runtime.NumCPU())
	for {
		roots := append(tg.st.gatewayRoots(), tg.st.clientRoots()...)
		c0 := treesCPU(roots)
		busy = busyCores(3 * time.Second)
		idle = treesCPU(roots) - c0
		load1 = loadAvg1()
		if busy <= limit {
			return load1, busy, idle, retries, false
		}
		if retries >= *flagRetries || b.waited >= *flagWaitMax {
			b.gaveUp++
			t.Logf("LOAD GATE GAVE UP: %s: %.2f busy cores before the point (limit %.2f) after %d waits (%v waited in this run, budget %v); running it anyway, flagged",
				what, busy, limit, retries, b.waited, *flagWaitMax)
			return load1, busy, idle, retries, true
		}
		retries++
		t.Logf("load gate: %s: %.2f busy cores (limit %.2f), load average %.2f; waiting 20 s (%d/%d)", what, busy, limit, load1, retries, *flagRetries)
		time.Sleep(20 * time.Second)
		b.waited += 20 * time.Second
	}
}

// point measures one run of tg and its native run.
func (b *bencher) point(t *testing.T, tg, native *target, u *topology.User, link string, n int, dir string, rep int) record.Row {
	what := fmt.Sprintf("%s %s P%d %s rep %d", tg.name, link, n, dir, rep)
	r := record.Row{Date: now(), Mode: b.mode, Config: tg.name, Commit: commitOf(tg.name, b.commit), Link: link, Streams: n, Dir: dir,
		Duration: *flagDuration, Rep: rep, Kept: true, GwCPU: -1, ClientCPU: -1}
	var gaveUp bool
	r.LoadBefore, r.BusyBefore, r.IdleCPU, r.Retries, gaveUp = b.gate(t, tg, what)
	if gaveUp {
		r.Note = fmt.Sprintf("LOAD GATE GAVE UP: %.2f busy cores before; ", r.BusyBefore)
	}
	gw, cli := tg.st.gatewayRoots(), tg.st.clientRoots()
	prof := startPerf(t, what, gw, cli)
	if prof != nil {
		r.Note += "profiled with perf; "
	}
	g0, c0, s0, m0 := treesCPU(gw), treesCPU(cli), procCPU(tg.srvPID), cpuStat()
	res, icpu, err := runIperf(t, tg.st.tp(), u, tg.st.job(iperfArgs(tg, n, dir, *flagDuration)...), *flagDuration)
	g1, c1, s1, m1 := treesCPU(gw), treesCPU(cli), procCPU(tg.srvPID), cpuStat()
	stopPerf(t, prof)
	r.BusyDuring = m1.busyCores(m0)
	if err == nil {
		err = tg.st.check(res.bytes)
	}
	if err != nil {
		r.Note += err.Error()
		r.Kept = false
		t.Errorf("%s: %v", what, err)
	} else {
		r.Mbps = res.bps / 1e6
		r.IperfCliCPU, r.IperfSrvCPU = icpu, s1-s0
		if len(gw) > 0 {
			r.GwCPU = g1 - g0
		}
		if len(cli) > 0 {
			r.ClientCPU = c1 - c0
		}
	}
	// The baseline of an IPv6 point is native routing over IPv6.
	nat := *native
	nat.v6 = tg.v6
	ns0 := procCPU(native.srvPID)
	nres, ncpu, err := runIperf(t, native.st.tp(), u, iperfArgs(&nat, n, dir, *flagDuration), *flagDuration)
	if err != nil {
		r.Note += " native: " + err.Error()
		r.NatIperfCli, r.NatIperfSrv = -1, -1
	} else {
		r.NativeMbps = nres.bps / 1e6
		r.NatIperfCli, r.NatIperfSrv = ncpu, procCPU(native.srvPID)-ns0
	}
	r.LoadDuring = loadAvg1()
	t.Logf("%-40s %8.1f Mbit/s  native %8.1f  ratio %.2f  cpu s gw %.2f cli %.2f  busy before %.2f during %.2f  load %.2f→%.2f",
		what, r.Mbps, r.NativeMbps, r.Ratio(), r.GwCPU, r.ClientCPU, r.BusyBefore, r.BusyDuring, r.LoadBefore, r.LoadDuring)
	return r
}

func iperfArgs(tg *target, streams int, dir string, secs int) []string {
	dst := tg.st.tp().INETAddr.String()
	if tg.v6 {
		dst = topology.INETAddr6.String()
	}
	a := []string{"iperf3", "-c", dst, "-p", strconv.Itoa(tg.port), "-t", strconv.Itoa(secs),
		"-P", strconv.Itoa(streams), "--json", "--connect-timeout", "5000"}
	if dir == "down" {
		a = append(a, "-R")
	}
	return a
}

type iperfRes struct {
	bps   float64
	bytes int64
}

// runIperf runs argv in cn as u and parses iperf3's JSON: received bits per
// second and bytes; it also returns the CPU seconds of the command.
func runIperf(t *testing.T, tp *topology.Topology, u *topology.User, argv []string, secs int) (iperfRes, float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+40)*time.Second)
	defer cancel()
	cmd := tp.Command(ctx, tp.CN, u, argv[0], argv[1:]...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	cpu := -1.0
	if cmd.ProcessState != nil {
		cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	code := topology.ExitCode(err)
	var r struct {
		End struct {
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(o.Bytes(), &r); err != nil {
		return iperfRes{}, cpu, fmt.Errorf("iperf3 exit %d, bad JSON: %.200q %.300q", code, o.String(), e.String())
	}
	if code != 0 || r.Error != "" || r.End.SumReceived.Bytes <= 0 {
		return iperfRes{}, cpu, fmt.Errorf("iperf3 exit %d: %s %.300q", code, r.Error, e.String())
	}
	return iperfRes{bps: r.End.SumReceived.BitsPerSecond, bytes: r.End.SumReceived.Bytes}, cpu, nil
}

// buildRR builds bench/rr into a world-readable directory (the test user
// runs it in the job's namespace).
func buildRR(t *testing.T) string {
	dir := topology.TempDir(t)
	path := filepath.Join(dir, "rr")
	cmd := exec.Command("go", "build", "-o", path, "./rr")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./rr: %v: %s", err, out)
	}
	return path
}

// wanProfile is an impairment between cn and dmz: RTT and random loss,
// split evenly over the two directions. The zero value is no relay.
type wanProfile struct {
	rtt  time.Duration
	loss float64 // percent, per direction
	set  bool
}

// parseWAN parses "RTTms-LOSSpercent", e.g. "40-0.1".
func parseWAN(s string) (wanProfile, error) {
	r, l, ok := strings.Cut(s, "-")
	ms, err1 := strconv.ParseFloat(r, 64)
	loss, err2 := strconv.ParseFloat(l, 64)
	if !ok || err1 != nil || err2 != nil || ms < 0 || loss < 0 || loss > 100 {
		return wanProfile{}, fmt.Errorf("%q: want RTT_MS-LOSS_PERCENT, e.g. 40-0.1", s)
	}
	return wanProfile{rtt: time.Duration(ms * float64(time.Millisecond)), loss: loss, set: true}, nil
}

// suffix is what the profile adds to a link name: "+rtt40ms-loss0.1%".
func (w wanProfile) suffix() string {
	if !w.set {
		return ""
	}
	return fmt.Sprintf("+rtt%gms-loss%g%%", float64(w.rtt)/float64(time.Millisecond), w.loss)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// sanitize makes a link name a directory name.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '%' || r == '+' {
			return '_'
		}
		return r
	}, s)
}

func now() string { return time.Now().UTC().Format(time.RFC3339) }

// writeMeta records the commit, machine and parameters of the run and
// returns the commit.
func writeMeta(t *testing.T, out string) string {
	var b strings.Builder
	commit, _ := exec.Command("git", "rev-parse", "HEAD").Output()
	if *flagCommit != "" {
		commit = []byte(*flagCommit)
	}
	bin := os.Getenv(topology.AirlockBinEnv)
	if bin == "" {
		bin = "built from the working tree (may hold uncommitted changes)"
	}
	kernel, _ := exec.Command("uname", "-r").Output()
	cpu := ""
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(info), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	hostCC, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	wg, _ := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "golang.zx2c4.com/wireguard").Output()
	fmt.Fprintf(&b, "host tcp_congestion_control\t%s\n", strings.TrimSpace(string(hostCC)))
	fmt.Fprintf(&b, "date\t%s\nmode\t%s\ncommit\t%s\nairlock\t%s\nkernel\t%s\ncpu\t%s\ncores\t%d\n",
		now(), *flagMode, strings.TrimSpace(string(commit)), bin, strings.TrimSpace(string(kernel)), cpu, runtime.NumCPU())
	fmt.Fprintf(&b, "duration\t%d\nreps\t%d\nstreams\t%s\nconfigs\t%s\nlinks\t%s\nwan\t%s\ncc\t%s\nlatency\t%s\nlatency links\t%s\nwarmup\t%d\nmaxload per core\t%g\nretries\t%d\nwait budget\t%v\n",
		*flagDuration, *flagReps, *flagStreams, *flagConfigs, *flagLinks, *flagWAN, *flagCC, *flagLatency, *flagLatLinks, *flagWarmup, *flagMaxLoad, *flagRetries, *flagWaitMax)
	fmt.Fprintf(&b, "wireguard-go module\t%s\n", strings.TrimSpace(string(wg)))
	for _, v := range []string{"iperf3", "ocserv", "openconnect", "ocproxy", "proxychains4", "slirp4netns", "openvpn", "wireguard-tools", "iputils-ping"} {
		ver, _ := exec.Command("dpkg-query", "-W", "-f=${Version}", v).Output()
		fmt.Fprintf(&b, "pkg %s\t%s\n", v, ver)
	}
	if err := os.WriteFile(filepath.Join(out, "meta.tsv"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("run directory %s\n%s", out, b.String())
	return strings.TrimSpace(string(commit))
}
