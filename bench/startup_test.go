// SPDX-License-Identifier: MIT

package bench

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// writeStartup writes startup.tsv into the run directory.
func writeStartup(t *testing.T, out string, startup []startupResult) {
	if len(startup) == 0 {
		return
	}
	var st strings.Builder
	st.WriteString("what\truns\tmedian_ms\tp95_ms\tnote\n")
	for _, r := range startup {
		fmt.Fprintf(&st, "%s\t%d\t%.1f\t%.1f\t%s\n", r.what, len(r.durs), ms(r.pct(50)), ms(r.pct(95)), strings.ReplaceAll(r.note, "\n", " "))
	}
	if err := os.WriteFile(filepath.Join(out, "startup.tsv"), []byte(st.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("startup.tsv:\n%s", st.String())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startupResult is one start-up measurement.
type startupResult struct {
	what string
	durs []time.Duration // sorted
	note string
}

func (r startupResult) pct(p int) time.Duration {
	if len(r.durs) == 0 {
		return 0
	}
	i := (len(r.durs)*p + 99) / 100
	if i > 0 {
		i--
	}
	return r.durs[i]
}

// benchStartup measures, runs times: for airlock, `airlock run -- true` as
// the test user in cn (join, namespace and TUN, WireGuard, exec, exit,
// release; includes ip netns exec and setpriv); for ocserv, from starting
// `vpnns` and `openconnect --no-dtls` to the first TCP connection from the
// namespace that reaches inet (teardown not included).
func benchStartup(t *testing.T, logs logDir, what string, runs int) startupResult {
	res := startupResult{what: what}
	tp := topology.New(t, topology.WithPrefix("bs"))
	u := topology.EnsureUser(t)
	switch what {
	case "airlock":
		res.what = "airlock run -- true"
		bin := topology.BuildAirlock(t)
		_, gateway, pin, token, err := airlockGateway(t, tp, logs, bin, "user")
		if err != nil {
			res.note = err.Error()
			return res
		}
		for i := 0; i < runs; i++ {
			t0 := time.Now()
			code, _, stderr := tp.Run(t, 60*time.Second, tp.CN, u, bin, "run", "--gateway", gateway, "--pin", pin, "--token", token, "--", "true")
			if code != 0 {
				res.note = fmt.Sprintf("exit %d: %.300s", code, stderr)
				res.durs = nil
				return res
			}
			res.durs = append(res.durs, time.Since(t0))
		}
	case "ocserv":
		res.what = "openconnect + vpnns to first connection"
		s, err := newOcserv(t, tp, logs, false, false)
		if err != nil {
			res.note = err.Error()
			return res
		}
		oc := s.(*ocservStack)
		failures := 0
		for i := 0; i < runs; i++ {
			home := filepath.Join(topology.TempDir(t), "home")
			if err := os.Mkdir(home, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(home, u.UID, u.GID); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			c, err := connectOpenconnectFast(t, tp, logs, u, home, oc.srvAddr, oc.pin)
			d := time.Since(t0)
			if err != nil && failures < 5 {
				// vpnns -- sometimes loses the race with its own watcher
				// ("can't connect to watcher"); count it and try again.
				failures++
				res.note = fmt.Sprintf("%d failed attempts not counted; last: %.200s", failures, err)
				i--
				continue
			}
			if err != nil {
				res.note = err.Error()
				res.durs = nil
				return res
			}
			res.durs = append(res.durs, d)
			c.oc.kill()
			c.ns.kill()
		}
	}
	sort.Slice(res.durs, func(i, j int) bool { return res.durs[i] < res.durs[j] })
	t.Logf("%s: %d runs, median %.1f ms, p95 %.1f ms", res.what, len(res.durs), ms(res.pct(50)), ms(res.pct(95)))
	return res
}

var (
	flagStartupBins = flag.String("startup.bins", "", "TestStartupAB: LABEL=PATH,... airlock binaries whose `run -- true` is timed, interleaved, each against a gateway of the same binary (default: this tree's build, as \"head\")")
	flagStartupRuns = flag.Int("startup.runs", 30, "TestStartupAB: runs of each binary")
	flagStartupGW   = flag.String("startup.gateway", "own", "TestStartupAB: own (each binary's jobs join a gateway of that binary) or head (every binary's jobs join one gateway built from this tree)")
	flagStartupFlr  = flag.Bool("startup.floor", true, "TestStartupAB: also time /bin/true through the same ip netns exec and setpriv, interleaved, as the row \"floor\": what every row's figure holds that is not airlock's")
)

// TestStartupAB times `airlock run -- true` (as the test user in cn, through
// ip netns exec and setpriv, as benchStartup does) for several airlock
// binaries, each against a user-mode gateway of the same binary in dmz
// (-startup.gateway own, the default: what a site running that version
// sees) or all against one gateway of this tree (head), runs interleaved
// (A, B, A, B, ...) so that the machine's load falls on all alike. It
// writes startup-ab.tsv (label, runs, median, p95, minimum, load average
// before and after) into the run directory. With -startup.floor (the
// default) a row "floor" times /bin/true run the same way, interleaved:
// the harness's own share of every row (ip netns exec, the TUN node's
// bind mount, setpriv), which airlock cannot cut:
//
//	AIRLOCK_BENCH=1 go test -count=1 -v -run TestStartupAB ./bench/ -args \
//	    -startup.bins=old=/tmp/airlock-930d510,new=$PWD/bin/airlock -startup.runs=40 -bench.out=DIR
func TestStartupAB(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH") != "1" {
		t.Skip("benchmark: set AIRLOCK_BENCH=1 (and run as root)")
	}
	topology.RequireRoot(t)
	out := *flagOut
	if out == "" {
		out = filepath.Join("results", "startup-"+time.Now().UTC().Format("2006-01-02T150405Z"))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	type bin struct {
		label, path       string
		gateway, pin, tok string
	}
	var bins []*bin
	for _, f := range splitList(*flagStartupBins) {
		l, p, ok := strings.Cut(f, "=")
		if !ok {
			t.Fatalf("-startup.bins %q: want LABEL=PATH", f)
		}
		bins = append(bins, &bin{label: l, path: p})
	}
	head := topology.BuildAirlock(t)
	if len(bins) == 0 {
		bins = []*bin{{label: "head", path: head}}
	}
	tp := topology.New(t, topology.WithPrefix("sa"))
	u := topology.EnsureUser(t)
	logs := logDir(filepath.Join(out, "logs"))
	for k, b := range bins {
		gwBin := b.path
		if *flagStartupGW == "head" {
			gwBin = head
		}
		if k > 0 && *flagStartupGW == "head" {
			b.gateway, b.pin, b.tok = bins[0].gateway, bins[0].pin, bins[0].tok
			continue
		}
		var err error
		b.gateway, b.pin, b.tok, err = gatewayOf(t, tp, logs, u, gwBin, b.label, 8443+uint16(k))
		if err != nil {
			t.Fatalf("%s: %v", b.label, err)
		}
	}
	if *flagStartupFlr {
		bins = append(bins, &bin{label: "floor", path: "/bin/true"})
	}
	load0 := loadAvg()
	durs := make([][]time.Duration, len(bins))
	for i := 0; i < *flagStartupRuns; i++ {
		for k, b := range bins {
			args := []string{"run", "--gateway", b.gateway, "--pin", b.pin, "--token", b.tok, "--", "true"}
			if b.label == "floor" && *flagStartupFlr {
				args = nil
			}
			t0 := time.Now()
			code, _, stderr := tp.Run(t, 60*time.Second, tp.CN, u, b.path, args...)
			d := time.Since(t0)
			if code != 0 {
				t.Fatalf("%s: exit %d: %.500s", b.label, code, stderr)
			}
			durs[k] = append(durs[k], d)
		}
	}
	load1 := loadAvg()
	var st strings.Builder
	fmt.Fprintf(&st, "# gateway: %s\n", *flagStartupGW)
	st.WriteString("label\truns\tmedian_ms\tp95_ms\tmin_ms\tload_before\tload_after\tpath\n")
	for k, b := range bins {
		sort.Slice(durs[k], func(i, j int) bool { return durs[k][i] < durs[k][j] })
		r := startupResult{what: b.label, durs: durs[k]}
		fmt.Fprintf(&st, "%s\t%d\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%s\n", b.label, len(r.durs), ms(r.pct(50)), ms(r.pct(95)), ms(r.durs[0]), load0, load1, b.path)
	}
	if err := os.WriteFile(filepath.Join(out, "startup-ab.tsv"), []byte(st.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("startup-ab.tsv:\n%s", st.String())
}

// gatewayOf starts an unprivileged user-mode gateway of binary bin in dmz
// on port and returns its address, pin and a token.
func gatewayOf(t *testing.T, tp *topology.Topology, logs logDir, u *topology.User, bin, tag string, port uint16) (gateway, pin, token string, err error) {
	base := topology.TempDir(t)
	if err := os.Chown(base, u.UID, u.GID); err != nil {
		return "", "", "", err
	}
	state := filepath.Join(base, "state")
	gw := startDaemon(t, tp, logs, "gateway-"+tag, tp.DMZ, u, "", bin, "gateway", "--state", state,
		"--listen", fmt.Sprintf("%s:%d", tp.DMZAddrCN, port), "--flow-log", "off")
	if err := waitUntil(30*time.Second, gw, func() bool {
		vals := readEnv(filepath.Join(state, "join.env"))
		gateway, pin = vals["AIRLOCK_GATEWAY"], vals["AIRLOCK_PIN"]
		return gateway != "" && pin != ""
	}); err != nil {
		return "", "", "", fmt.Errorf("gateway did not write join.env: %v: %s", err, gw.describe())
	}
	code, out, stderr := tp.Run(t, 30*time.Second, tp.DMZ, u, bin, "token", "create", "--state", state, "--name", "bench", "--ttl", "24h")
	if code != 0 {
		return "", "", "", fmt.Errorf("token create: exit %d: %s", code, stderr)
	}
	return gateway, pin, strings.TrimSpace(out), nil
}
