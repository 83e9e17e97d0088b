package bench

// Theory of operation: TestBench loops over link settings (1 Gbit tbf on
// every veth, uncapped) and configurations (native, airlock,
// airlock-kernel, ocserv, ocserv-slirp, slirp). For each pair it builds two topologies with the same
// link setting: one for the configuration under test and one with native
// routing. Every iperf3 run of the configuration is immediately followed by
// the same iperf3 run on the native topology, so each figure carries its own
// baseline taken seconds apart. A configuration that cannot be set up is
// recorded as "not measured: REASON" and the loop goes on.
//
// Each configuration is a stack: job(args) returns the argv that runs args
// as the unprivileged test user inside the job's network (in cn), and
// gatewayRoots/clientRoots name the process trees whose CPU time
// (utime+stime from /proc/PID/stat, children included) is charged to the
// gateway and to the client for the transferred bits.

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/impair"
	"github.com/airlock-vpn/airlock/test/topology"
)

func TestMain(m *testing.M) { topology.Main(m) }

var (
	flagDuration = flag.Int("bench.duration", 10, "iperf3 duration in seconds")
	flagReps     = flag.Int("bench.reps", 3, "repetitions of every iperf3 run")
	flagStreams  = flag.String("bench.streams", "1,2,10,20", "parallel stream counts")
	flagConfigs  = flag.String("bench.configs", "native,airlock,airlock-netstack,airlock-kernel,airlock-seccomp,airlock-preload,ocserv,ocserv-slirp,ocserv-ocproxy,slirp", "configurations (also: ocserv-dtls, airlock-tcp)")
	flagLinks    = flag.String("bench.links", "1gbit,uncapped", "link settings: a tc rate or \"uncapped\"")
	flagWAN      = flag.String("bench.wan", "", "impairment profiles between cn and dmz, RTTms-LOSSpercent (e.g. \"10-0,40-0.1\"); empty: none")
	flagCC       = flag.String("bench.cc", "", "TCP congestion control in every namespace of the topologies (e.g. cubic); empty: the host's default")
	flagStartup  = flag.Int("bench.startup", 50, "runs of each start-up measurement (0 skips)")
	flagOut      = flag.String("bench.out", "", "result directory (default bench/results/DATE)")
	flagShim     = flag.String("bench.shim", "", "path of the built fakeroot.so (ocserv-slirp needs it)")
	flagCommit   = flag.String("bench.commit", "", "commit the airlock binary was built from (default: git HEAD)")
)

// row is one iperf3 run of a configuration with its interleaved native run.
type row struct {
	Config, Link  string
	Streams       int
	Dir           string // "up" (job → outside) or "down" (-R)
	Rep           int
	Gbps, Native  float64
	GwCPU, CliCPU float64 // CPU seconds per transferred Gbit; NaN-free: -1 when n/a
	Note          string
}

func (r row) ratio() float64 {
	if r.Native <= 0 {
		return 0
	}
	return r.Gbps / r.Native
}

// TestBench is the benchmark entry point; see the file comment.
func TestBench(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH") != "1" {
		t.Skip("benchmark: set AIRLOCK_BENCH=1 (and run as root), or use bench/run.sh")
	}
	topology.RequireRoot(t)
	out := *flagOut
	if out == "" {
		out = filepath.Join("results", time.Now().Format("2006-01-02T150405"))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	writeMeta(t, out)
	topology.EnsureUser(t)
	topology.PrepareTUN(t)
	topology.BuildAirlock(t)
	topology.BuildPeer(t)

	var streams []int
	for _, s := range strings.Split(*flagStreams, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			t.Fatalf("-bench.streams: %v", err)
		}
		streams = append(streams, n)
	}
	wans := []wanProfile{{}}
	if *flagWAN != "" {
		wans = nil
		for _, w := range strings.Split(*flagWAN, ",") {
			p, err := parseWAN(strings.TrimSpace(w))
			if err != nil {
				t.Fatalf("-bench.wan: %v", err)
			}
			wans = append(wans, p)
		}
	}
	tsv := newTSV(t, filepath.Join(out, "runs.tsv"))
	var rows []row
	var notes []string
	for _, links := range strings.Split(*flagLinks, ",") {
		for _, wan := range wans {
			for _, cfg := range strings.Split(*flagConfigs, ",") {
				cfg, link := strings.TrimSpace(cfg), strings.TrimSpace(links)+wan.suffix()
				var got []row
				var reason string
				ok := t.Run(cfg+"/"+link, func(t *testing.T) {
					got, reason = benchConfig(t, cfg, strings.TrimSpace(links), wan, streams)
				})
				if !ok && reason == "" {
					reason = "setup or run failed (see test log)"
				}
				if reason != "" {
					notes = append(notes, fmt.Sprintf("%s, %s: not measured: %s", cfg, link, reason))
					tsv.write(row{Config: cfg, Link: link, Note: "not measured: " + reason})
					t.Logf("%s %s: not measured: %s", cfg, link, reason)
				}
				for _, r := range got {
					tsv.write(r)
				}
				rows = append(rows, got...)
			}
		}
	}
	tsv.close()

	var startup []startupResult
	if *flagStartup > 0 {
		for _, s := range []string{"airlock", "ocserv"} {
			if !strings.Contains(*flagConfigs, s) {
				continue
			}
			var res startupResult
			t.Run("startup/"+s, func(t *testing.T) { res = benchStartup(t, s, *flagStartup) })
			startup = append(startup, res)
		}
	}
	writeSummary(t, out, rows, notes, startup)
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

// benchConfig measures one configuration on one link setting, through the
// impairment relay if wan is set. It returns the rows, or a reason why the
// configuration was not measured.
func benchConfig(t *testing.T, cfg, rate string, wan wanProfile, streams []int) ([]row, string) {
	link := rate + wan.suffix()
	var opts []topology.Option
	if rate != "uncapped" {
		opts = append(opts, topology.WithRate(rate))
	}
	if wan.set {
		opts = append(opts, topology.WithImpairment(impair.Symmetric(wan.rtt, wan.loss/100)))
	}
	if *flagCC != "" {
		opts = append(opts, topology.WithCongestionControl(*flagCC))
	}
	native := topology.New(t, append(opts, topology.WithNativeRouting(), topology.WithPrefix("bn"))...)
	nativePort := native.StartIperf3Server(t)
	u := topology.EnsureUser(t)

	st, err := newStack(t, cfg, opts)
	if err != nil {
		return nil, err.Error()
	}
	port := st.tp().StartIperf3Server(t)
	var rows []row
	for _, n := range streams {
		for _, dir := range []string{"up", "down"} {
			for rep := 1; rep <= *flagReps; rep++ {
				args := iperfArgs(st.tp().INETAddr.String(), port, n, dir)
				g0, c0 := treesCPU(st.gatewayRoots()), treesCPU(st.clientRoots())
				res, err := runIperf(t, st.tp(), u, st.job(args...))
				g1, c1 := treesCPU(st.gatewayRoots()), treesCPU(st.clientRoots())
				r := row{Config: cfg, Link: link, Streams: n, Dir: dir, Rep: rep, GwCPU: -1, CliCPU: -1}
				if err != nil {
					r.Note = err.Error()
					t.Logf("%s %s P%d %s rep %d: %v", cfg, link, n, dir, rep, err)
				} else {
					r.Gbps = res.bps / 1e9
					gbit := float64(res.bytes) * 8 / 1e9
					if len(st.gatewayRoots()) > 0 && gbit > 0 {
						r.GwCPU = (g1 - g0) / gbit
					}
					if len(st.clientRoots()) > 0 && gbit > 0 {
						r.CliCPU = (c1 - c0) / gbit
					}
				}
				nres, err := runIperf(t, native, u, append([]string{"iperf3"}, iperfArgs(native.INETAddr.String(), nativePort, n, dir)...))
				if err != nil {
					r.Note += " native: " + err.Error()
				} else {
					r.Native = nres.bps / 1e9
				}
				t.Logf("%-12s %-8s P%-2d %-4s rep %d: %6.2f Gbit/s  native %6.2f  ratio %.2f  cpu/Gbit gw %.3f cli %.3f",
					cfg, link, n, dir, rep, r.Gbps, r.Native, r.ratio(), r.GwCPU, r.CliCPU)
				rows = append(rows, r)
			}
		}
	}
	return rows, ""
}

func iperfArgs(server string, port, streams int, dir string) []string {
	a := []string{"-c", server, "-p", strconv.Itoa(port), "-t", strconv.Itoa(*flagDuration),
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
// second and bytes.
func runIperf(t *testing.T, tp *topology.Topology, u *topology.User, argv []string) (iperfRes, error) {
	timeout := time.Duration(*flagDuration+40) * time.Second
	code, out, stderr := tp.Run(t, timeout, tp.CN, u, argv[0], argv[1:]...)
	var r struct {
		End struct {
			SumReceived struct {
				Bytes         int64   `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return iperfRes{}, fmt.Errorf("iperf3 exit %d, bad JSON: %.200q %.300q", code, out, stderr)
	}
	if code != 0 || r.Error != "" || r.End.SumReceived.Bytes <= 0 {
		return iperfRes{}, fmt.Errorf("iperf3 exit %d: %s %.300q", code, r.Error, stderr)
	}
	return iperfRes{bps: r.End.SumReceived.BitsPerSecond, bytes: r.End.SumReceived.Bytes}, nil
}

// writeMeta records the commit, machine and parameters of the run.
func writeMeta(t *testing.T, out string) {
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
	fmt.Fprintf(&b, "host tcp_congestion_control\t%s\n", strings.TrimSpace(string(hostCC)))
	fmt.Fprintf(&b, "date\t%s\ncommit\t%s\nairlock\t%s\nkernel\t%s\ncpu\t%s\ncores\t%d\n",
		time.Now().UTC().Format(time.RFC3339), strings.TrimSpace(string(commit)), bin,
		strings.TrimSpace(string(kernel)), cpu, runtime.NumCPU())
	fmt.Fprintf(&b, "duration\t%d\nreps\t%d\nstreams\t%s\nconfigs\t%s\nlinks\t%s\nwan\t%s\ncc\t%s\n",
		*flagDuration, *flagReps, *flagStreams, *flagConfigs, *flagLinks, *flagWAN, *flagCC)
	for _, v := range []string{"iperf3", "ocserv", "openconnect", "ocproxy", "proxychains4", "slirp4netns"} {
		ver, _ := exec.Command("dpkg-query", "-W", "-f=${Version}", v).Output()
		fmt.Fprintf(&b, "pkg %s\t%s\n", v, ver)
	}
	if err := os.WriteFile(filepath.Join(out, "meta.tsv"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("results in %s\n%s", out, b.String())
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
