// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// tunnelPrefix is where job tunnel addresses come from (CGNAT space).
var tunnelPrefix = netip.MustParsePrefix("100.64.0.0/10")

// TestAirlock runs the functional end-to-end checks against each egress
// mode, each on one shared environment. Subtests run one after another:
// several of them check that nothing of the test user is left behind,
// which only holds when no other job is running.
func TestAirlock(t *testing.T) {
	for _, mode := range []string{modeUser, modeUserNetstack, modeKernel} {
		t.Run(mode, func(t *testing.T) { testAirlock(t, mode) })
	}
}

func testAirlock(t *testing.T, mode string) {
	e := newEnvMode(t, mode)
	var gwTunnel netip.Addr // the gateway's tunnel address, from the job's resolv.conf

	t.Run("StateDir", func(t *testing.T) {
		fi, err := os.Stat(e.state)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("state dir mode = %v, want 0700", fi.Mode().Perm())
		}
		want := 0 // kernel mode: the gateway runs as root
		if e.gwUser != nil {
			want = e.gwUser.UID
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != want {
			t.Errorf("state dir owner = %d, want %d (the gateway's user)", uid, want)
		}
	})

	t.Run("TCPStack", func(t *testing.T) {
		// What terminates the jobs' TCP, as the gateway logs it at start.
		want := map[string]string{
			modeUser:         `tcp="kernel (IPv4), netstack (IPv6)"`,
			modeUserNetstack: `tcp=netstack`,
		}[mode]
		if want != "" && !strings.Contains(e.gw.Stderr(), want) {
			t.Errorf("gateway log does not say %s%s", want, e.diag(""))
		}
	})

	t.Run("JobNetwork", func(t *testing.T) {
		out := e.mustRun(t, "sh", "-c", "ip -o link show; echo ==; ip -4 -o addr show tun0; echo ==; ip route show default; echo ==; cat /etc/resolv.conf")
		parts := strings.Split(out, "==\n")
		if len(parts) != 4 {
			t.Fatalf("unexpected output %q", out)
		}
		var links []string
		for _, m := range regexp.MustCompile(`(?m)^\d+: ([^:@]+)[:@]`).FindAllStringSubmatch(parts[0], -1) {
			links = append(links, m[1])
		}
		if strings.Join(links, ",") != "lo,tun0" {
			t.Errorf("job links = %v, want [lo tun0]\n%s", links, parts[0])
		}
		if a, ok := tunAddr(parts[1]); !ok || !tunnelPrefix.Contains(a) {
			t.Errorf("tun0 address %q, want one in %v", parts[1], tunnelPrefix)
		}
		if !strings.Contains(parts[2], "default") || !strings.Contains(parts[2], "dev tun0") {
			t.Errorf("default route %q, want default dev tun0", parts[2])
		}
		m := regexp.MustCompile(`(?m)^nameserver\s+(\S+)`).FindStringSubmatch(parts[3])
		if m == nil {
			t.Fatalf("job resolv.conf has no nameserver:\n%s", parts[3])
		}
		a, err := netip.ParseAddr(m[1])
		if err != nil || !tunnelPrefix.Contains(a) {
			t.Errorf("job nameserver %q, want the gateway's tunnel address in %v", m[1], tunnelPrefix)
		}
		gwTunnel = a
	})

	t.Run("HTTPByName100MiB", func(t *testing.T) {
		url := fmt.Sprintf("http://%s:%d/big", zoneName, e.httpPort)
		start := time.Now()
		out := e.mustRun(t, "bash", "-c", "set -o pipefail; curl -sS --max-time 60 "+url+" | sha256sum")
		d := time.Since(start)
		if got := strings.Fields(out); len(got) == 0 || got[0] != e.sha["big"] {
			t.Fatalf("sha256 of %s = %q, want %s", url, out, e.sha["big"])
		}
		t.Logf("100 MiB by name in %v (%.0f Mbit/s including join)", d.Round(time.Millisecond), float64(bigSize)*8/d.Seconds()/1e6)
	})

	t.Run("UDPEcho1000", func(t *testing.T) {
		ap := netip.AddrPortFrom(e.tp.INETAddr, uint16(e.udpPort)).String()
		code, out, stderr := e.run(t, e.peer, "udpclient", ap, "1000")
		if code != 0 || strings.TrimSpace(out) != "ok 1000" {
			t.Fatalf("udpclient %s 1000: exit %d, %q%s", ap, code, out, e.diag(stderr))
		}
		if stderr != "" {
			t.Logf("udpclient: %s", stderr)
		}
	})

	t.Run("DNS", func(t *testing.T) {
		want := e.tp.INETAddr.String()
		if out := e.mustRun(t, "dig", "+short", "+time=2", "+tries=2", zoneName); strings.TrimSpace(out) != want {
			t.Errorf("dig +short %s = %q, want %s", zoneName, out, want)
		}
		if out := e.mustRun(t, "dig", "+short", "+tcp", "+time=2", "+tries=2", zoneName); strings.TrimSpace(out) != want {
			t.Errorf("dig +short +tcp %s = %q, want %s", zoneName, out, want)
		}
		if out := e.mustRun(t, "getent", "hosts", zoneName); !strings.HasPrefix(out, want+" ") {
			t.Errorf("getent hosts %s = %q, want %s first", zoneName, out, want)
		}
		if code, out, stderr := e.run(t, "getent", "hosts", "nxdomain.airlock.test"); code != 2 {
			t.Errorf("getent hosts nxdomain.airlock.test: exit %d, %q, want 2 (not found)%s", code, out, e.diag(stderr))
		}
	})

	t.Run("Ping", func(t *testing.T) {
		if isUserMode(mode) && !strings.Contains(e.gw.Stderr(), "relayed through ping sockets") {
			t.Errorf("user-mode gateway did not log that ping is relayed (dmz's ping_group_range includes its group)%s", e.diag(""))
		}
		targets := []struct {
			name  string
			addr  netip.Addr
			count string
		}{{"inet", e.tp.INETAddr, "3"}}
		if gwTunnel.IsValid() {
			targets = append(targets, struct {
				name  string
				addr  netip.Addr
				count string
			}{"gateway tunnel address", gwTunnel, "1"})
		}
		for _, tc := range targets {
			code, out, stderr := e.run(t, "ping", "-n", "-c", tc.count, "-W", "2", tc.addr.String())
			if code != 0 {
				t.Errorf("ping -c %s %s (%s): exit %d, %q%s", tc.count, tc.addr, tc.name, code, out, e.diag(stderr))
				continue
			}
			want := tc.count + " received"
			if !strings.Contains(out, want) {
				t.Errorf("ping -c %s %s (%s): %q, want %q", tc.count, tc.addr, tc.name, out, want)
			}
			if !strings.Contains(out, "from "+tc.addr.String()+":") {
				t.Errorf("ping %s (%s): replies not from %s: %q", tc.addr, tc.name, tc.addr, out)
			}
		}
		if !gwTunnel.IsValid() {
			t.Error("gateway tunnel address unknown (JobNetwork failed); not pinged")
		}

		// iputils ping falls back to a raw socket through its cap_net_raw
		// file capability, which holds in the job's user namespace. A copy
		// without it needs the ICMP ping socket that airlock run allows in
		// the job's network namespace (net.ipv4.ping_group_range).
		want := fmt.Sprintf("%d\t%d", e.u.GID, e.u.GID)
		if out := e.mustRun(t, "cat", "/proc/sys/net/ipv4/ping_group_range"); strings.TrimSpace(out) != want {
			t.Errorf("job's net.ipv4.ping_group_range = %q, want %q (its own group)", out, want)
		}
		path, err := exec.LookPath("ping")
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		nocaps := filepath.Join(topology.TempDir(t), "ping-nocaps")
		if err := os.WriteFile(nocaps, b, 0o755); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := e.run(t, nocaps, "-n", "-c", "1", "-W", "2", e.tp.INETAddr.String())
		if code != 0 || !strings.Contains(out, "1 received") {
			t.Errorf("ping without capabilities (ping socket) to %s: exit %d, %q%s", e.tp.INETAddr, code, out, e.diag(stderr))
		}
	})

	t.Run("ExitStatus", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			want int
		}{
			{"true", []string{"true"}, 0},
			{"exit3", []string{"sh", "-c", "exit 3"}, 3},
			{"sigkill", []string{"sh", "-c", "kill -9 $$"}, 137},
			{"notfound", []string{"/nonexistent/airlock-no-such-command"}, 127},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := e.snapshot()
				code, out, stderr := e.run(t, tc.args...)
				if code != tc.want {
					t.Errorf("airlock run -- %s: exit %d, want %d; stdout %q%s", strings.Join(tc.args, " "), code, tc.want, out, e.diag(stderr))
				}
				e.checkNoLeftovers(t, before, "airlock run -- "+strings.Join(tc.args, " "))
			})
		}
	})

	t.Run("SIGTERMReachesJob", func(t *testing.T) {
		before := e.snapshot()
		p := e.start(t, "sh", "-c", `trap "exit 42" TERM; echo ready; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; exit 7`)
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(p.Stdout(), "ready") {
			if ok, code := p.Exited(); ok {
				t.Fatalf("job exited %d before it was ready: stdout %q%s", code, p.Stdout(), e.diag(p.Stderr()))
			}
			if time.Now().After(deadline) {
				t.Fatalf("job not ready after 30 s%s", e.diag(p.Stderr()))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, err := p.Wait(15 * time.Second)
		if err != nil {
			t.Fatalf("airlock run did not exit within 15 s of SIGTERM%s", e.diag(p.Stderr()))
		}
		if code != 42 {
			t.Errorf("exit %d after SIGTERM, want 42 (the job's trap)%s", code, e.diag(p.Stderr()))
		}
		e.checkNoLeftovers(t, before, "SIGTERM")
	})

	t.Run("UID", func(t *testing.T) {
		out := e.mustRun(t, "sh", "-c", "id -u; id -g")
		want := fmt.Sprintf("%d\n%d\n", e.u.UID, e.u.GID)
		if out != want {
			t.Errorf("id -u; id -g inside the job = %q, want %q", out, want)
		}
	})

	t.Run("EnvVars", func(t *testing.T) {
		code, out, stderr := e.runWith(t, runOpts{viaEnv: true}, "sh", "-c", "echo ok")
		if code != 0 || out != "ok\n" {
			t.Errorf("with AIRLOCK_GATEWAY/PIN/TOKEN: exit %d, %q%s", code, out, e.diag(stderr))
		}
	})

	t.Run("ConcurrentJobs", func(t *testing.T) {
		url := fmt.Sprintf("http://%s:%d/small", zoneName, e.httpPort)
		script := "set -o pipefail; ip -4 -o addr show tun0; curl -sS --max-time 60 " + url + " | sha256sum; sleep 0.5"
		p1 := e.start(t, "bash", "-c", script)
		p2 := e.start(t, "bash", "-c", script)
		var addrs []netip.Addr
		for i, p := range []*topology.Process{p1, p2} {
			code, err := p.Wait(runTimeout)
			if err != nil || code != 0 {
				t.Fatalf("job %d: exit %d (%v), stdout %q%s", i+1, code, err, p.Stdout(), e.diag(p.Stderr()))
			}
			a, ok := tunAddr(p.Stdout())
			if !ok || !tunnelPrefix.Contains(a) {
				t.Errorf("job %d: no tun0 address in %v: %q", i+1, tunnelPrefix, p.Stdout())
			}
			if !strings.Contains(p.Stdout(), e.sha["small"]) {
				t.Errorf("job %d: fetch of %s: %q, want sha256 %s", i+1, url, p.Stdout(), e.sha["small"])
			}
			addrs = append(addrs, a)
		}
		if addrs[0] == addrs[1] {
			t.Errorf("both concurrent jobs got %v; want distinct addresses", addrs[0])
		}
	})

	t.Run("NoGatewayLoopback", func(t *testing.T) {
		if !gwTunnel.IsValid() {
			t.Skip("gateway tunnel address unknown (JobNetwork failed)")
		}
		port := uint16(e.tp.Port())
		lo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
		e.tp.StartTCPListener(t, e.tp.DMZ, lo)
		for _, target := range []netip.AddrPort{lo, netip.AddrPortFrom(gwTunnel, port)} {
			code, out, stderr := e.run(t, e.peer, "tcpcheck", target.String())
			if code == 0 {
				t.Errorf("job connected to %v, which leads to dmz's 127.0.0.1:%d; want failure%s", target, port, e.diag(stderr))
			} else if code != 1 {
				t.Errorf("tcpcheck %v: exit %d, want 1 (connect failed): %q%s", target, code, out, e.diag(stderr))
			}
		}
		// A shell /dev/tcp connect to the gateway's tunnel address fails, and
		// quickly (refused, not a 5 s timeout).
		start := time.Now()
		code, _, stderr := e.run(t, "timeout", "5", "bash", "-c", fmt.Sprintf("echo hi > /dev/tcp/%s/%d", gwTunnel, port))
		d := time.Since(start)
		if code == 0 || code == 124 {
			t.Errorf("/dev/tcp/%s/%d: exit %d after %v, want a quick failure (not 0, not 124 = timed out)%s", gwTunnel, port, code, d, e.diag(stderr))
		}
		t.Logf("/dev/tcp to the gateway's tunnel address: exit %d in %v", code, d.Round(time.Millisecond))
	})

	t.Run("GatewayHostDenied", func(t *testing.T) {
		// Default policy denies the gateway host itself, on all its addresses.
		port := uint16(e.tp.Port())
		e.tp.StartTCPListener(t, e.tp.DMZ, netip.AddrPortFrom(netip.IPv4Unspecified(), port))
		targets := []netip.AddrPort{
			netip.AddrPortFrom(e.tp.DMZAddrCN, port),
			netip.AddrPortFrom(e.tp.DMZAddrINET, port),
		}
		if gwTunnel.IsValid() {
			targets = append(targets, netip.AddrPortFrom(gwTunnel, port))
		}
		for _, target := range targets {
			if !e.tp.TCPCheck(t, e.tp.DMZ, nil, target) && target.Addr() != gwTunnel {
				t.Fatalf("listener not reachable from dmz at %v", target)
			}
			if code, _, stderr := e.run(t, e.peer, "tcpcheck", target.String()); code == 0 {
				t.Errorf("job connected to the gateway host at %v; want denied (DESIGN.md: policy's safe defaults deny the gateway host itself)%s", target, e.diag(stderr))
			}
		}
	})

	// The built-in floor without a config file is the conformance
	// suite's (internal/forward/forwardtest, testFloor), in every mode.

	t.Run("DirectBlocked", func(t *testing.T) {
		web := netip.AddrPortFrom(e.tp.INETAddr, uint16(e.httpPort))
		if e.tp.TCPCheck(t, e.tp.CN, e.u, web) {
			t.Fatalf("cn reached %v without airlock; the topology is not isolated", web)
		}
	})

	t.Run("Failures", func(t *testing.T) {
		closed := netip.AddrPortFrom(e.tp.DMZAddrCN, gatewayPort+1).String()
		wrongPin := "sha256:" + strings.Repeat("0", 64)
		for _, tc := range []struct {
			name string
			o    runOpts
			want []*regexp.Regexp // all must match stderr
		}{
			{"WrongToken", runOpts{token: "not-a-valid-token"}, []*regexp.Regexp{
				regexp.MustCompile(`(?i)token`), regexp.MustCompile(`(?i)reject|invalid|denied|unauthori[sz]ed|unknown|not accepted|refused`)}},
			{"WrongPin", runOpts{pin: wrongPin}, []*regexp.Regexp{
				regexp.MustCompile(`(?i)fingerprint|pin`)}},
			// A gateway that does not answer may be restarting: the job
			// waits for it, up to --join-timeout, and says so.
			{"GatewayDown", runOpts{gateway: closed, flags: []string{"--join-timeout", "4s"}}, []*regexp.Regexp{
				regexp.MustCompile(`(?i)gateway`), regexp.MustCompile(`(?i)reach|connect|refused|unreachable|timed? ?out`),
				regexp.MustCompile(`waiting for it`), regexp.MustCompile(`--join-timeout`)}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tc.o.timeout = 40 * time.Second
				before := e.snapshot()
				start := time.Now()
				code, out, stderr := e.runWith(t, tc.o, "sh", "-c", "echo job-ran")
				if code != 125 {
					t.Errorf("exit %d, want 125 (airlock's own failure)%s", code, e.diag(stderr))
				}
				if strings.Contains(out, "job-ran") {
					t.Errorf("the job ran although joining failed: %q", out)
				}
				for _, re := range tc.want {
					if !re.MatchString(stderr) {
						t.Errorf("stderr does not match %v: %q", re, stderr)
					}
				}
				t.Logf("failed in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr))
				e.checkNoLeftovers(t, before, tc.name)
			})
		}
	})

	t.Run("TokenLifecycle", func(t *testing.T) {
		tok := e.createToken(t, "e2e-revoke")
		code, out, stderr := e.admin(t, "token", "list", "--state", e.state)
		if code != 0 || !strings.Contains(out, "e2e-revoke") || !strings.Contains(out, "e2e") {
			t.Errorf("token list: exit %d, %q, want both tokens listed%s", code, out, e.diag(stderr))
		}
		if strings.Contains(out, tok) {
			t.Errorf("token list shows the secret token itself: %q", out)
		}
		if code, out, stderr := e.runWith(t, runOpts{token: tok}, "true"); code != 0 {
			t.Fatalf("run with new token: exit %d, %q%s", code, out, e.diag(stderr))
		}
		if code, out, stderr := e.admin(t, "token", "revoke", "--state", e.state, "e2e-revoke"); code != 0 {
			t.Fatalf("token revoke: exit %d, %q%s", code, out, e.diag(stderr))
		}
		code, _, stderr = e.runWith(t, runOpts{token: tok, timeout: 40 * time.Second}, "true")
		if code != 125 || !regexp.MustCompile(`(?i)token`).MatchString(stderr) {
			t.Errorf("run with revoked token: exit %d, want 125 with a message about the token%s", code, e.diag(stderr))
		}
		// The other token still works.
		if code, _, stderr := e.run(t, "true"); code != 0 {
			t.Errorf("run with the unrevoked token after a revoke: exit %d%s", code, e.diag(stderr))
		}
	})

	// seen maps outside source ports the jobs used to their job ids, for
	// whois after the restart; seenAt is a time when both jobs ran.
	seen := map[uint16]string{}
	var seenAt time.Time
	t.Run("PortBlocks", func(t *testing.T) {
		seen, seenAt = checkPortBlocks(t, e)
	})

	t.Run("Expose", func(t *testing.T) { checkExpose(t, e) })

	var prefix6 netip.Prefix
	t.Run("IPv6", func(t *testing.T) { prefix6 = checkIPv6(t, e) })
	if mode == modeKernel {
		t.Run("IPv6Kernel", func(t *testing.T) { checkIPv6Kernel(t, e) }) // ipv6kernel_test.go
	}

	t.Run("Restart", func(t *testing.T) {
		checkRestart(t, e, seen, seenAt)
		// The restarted gateway lives as long as this subtest (kernel
		// mode's check ends with it stopped, to see its clean-up).
		if prefix6.IsValid() && mode != modeKernel {
			t.Run("IPv6", func(t *testing.T) { checkIPv6AfterRestart(t, e, prefix6) })
		}
	})
}

// tunAddr extracts the address from `ip -4 -o addr show tun0` output.
func tunAddr(out string) (netip.Addr, bool) {
	m := regexp.MustCompile(`\binet (\d+\.\d+\.\d+\.\d+)/\d+`).FindStringSubmatch(out)
	if m == nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(m[1])
	return a, err == nil
}

// iperfResult is the part of iperf3 --json output the tests read.
type iperfResult struct {
	End struct {
		SumSent     iperfSum `json:"sum_sent"`
		SumReceived iperfSum `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

type iperfSum struct {
	Bytes         int64   `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
}

// TestIperf3 measures throughput through airlock with 1 and 10 streams in
// both directions and, for comparison, over native routing on a second
// topology. It asserts success and data moved, not speed.
func TestIperf3(t *testing.T) {
	e := newEnv(t)
	port := e.tp.StartIperf3Server(t)
	native := topology.New(t, topology.WithNativeRouting())
	nativePort := native.StartIperf3Server(t)

	type row struct {
		name           string
		airlock, local float64
	}
	var rows []row
	for _, streams := range []int{1, 10} {
		for _, reverse := range []bool{false, true} {
			name := fmt.Sprintf("P%d", streams)
			args := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-t", "3", "-P", strconv.Itoa(streams), "--json", "--connect-timeout", "5000"}
			if reverse {
				name += "-R"
				args = append(args, "-R")
			}
			t.Run(name, func(t *testing.T) {
				code, out, stderr := e.runWith(t, runOpts{timeout: 40 * time.Second}, append(args, "-p", strconv.Itoa(port))...)
				a := parseIperf(t, "airlock", code, out, stderr, e.diag(stderr))
				code, out, stderr = native.Run(t, 40*time.Second, native.CN, e.u, args[0], append(args[1:], "-p", strconv.Itoa(nativePort))...)
				n := parseIperf(t, "native", code, out, stderr, "")
				rows = append(rows, row{name, a, n})
				t.Logf("%s: airlock %.2f Gbit/s, native %.2f Gbit/s", name, a/1e9, n/1e9)
			})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-6s %10s %10s %7s\n", "test", "airlock", "native", "ratio")
	for _, r := range rows {
		ratio := 0.0
		if r.local > 0 {
			ratio = r.airlock / r.local
		}
		fmt.Fprintf(&b, "%-6s %7.2f Gb %7.2f Gb %6.0f%%\n", r.name, r.airlock/1e9, r.local/1e9, ratio*100)
	}
	t.Logf("iperf3 -t 3, uncapped veth, 2 cores (no timing assertions):\n%s", b.String())
}

// parseIperf checks an iperf3 --json run and returns the received bits per
// second.
func parseIperf(t *testing.T, what string, code int, out, stderr, diag string) float64 {
	t.Helper()
	var r iperfResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Errorf("%s iperf3: exit %d, bad JSON (%v): %.500s%s", what, code, err, out, diag)
		return 0
	}
	if code != 0 || r.Error != "" {
		t.Errorf("%s iperf3: exit %d, error %q; stderr %s%s", what, code, r.Error, stderr, diag)
	}
	if r.End.SumReceived.Bytes <= 0 || r.End.SumSent.Bytes <= 0 {
		t.Errorf("%s iperf3: sent %d, received %d bytes; want > 0", what, r.End.SumSent.Bytes, r.End.SumReceived.Bytes)
	}
	return r.End.SumReceived.BitsPerSecond
}
