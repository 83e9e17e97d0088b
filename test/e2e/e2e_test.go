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

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
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
	at := &airlockTest{mode: mode}
	at.e = newEnvMode(t, mode)

	t.Run("StateDir", at.stateDir)
	t.Run("TCPStack", at.tcpStack)
	// Each family's subtests where both have them; the IPv6 side of the
	// job's network (jobIPv6) is what later IPv6 subtests use.
	t.Run("JobNetwork", func(t *testing.T) {
		t.Run("IPv4", at.jobNetwork)
		t.Run("IPv6", func(t *testing.T) { at.job6 = jobIPv6(t, at.e) })
	})
	forFamilies(t, "HTTPByName100MiB", at.httpByName100MiB)
	t.Run("HTTPByNameDualStack", at.httpByNameDualStack)
	forFamilies(t, "UDPEcho", at.udpEcho)
	t.Run("DNS", func(t *testing.T) {
		t.Run("IPv4", at.dns)
		t.Run("IPv6", at.dns6)
	})
	t.Run("Ping", func(t *testing.T) {
		t.Run("IPv4", at.ping)
		if mode == modeKernel {
			// User modes: TestFallbackModes/Ping6Netns.
			t.Run("IPv6", at.ping6)
		}
	})
	if mode == modeKernel {
		t.Run("PacketTooBig", at.packetTooBig)
	}
	t.Run("Iperf3IPv6BothWays", at.iperf3IPv6) // IPv4: TestIperf3
	t.Run("ExitStatus", at.exitStatus)
	t.Run("SIGTERMReachesJob", at.sigtermReachesJob)
	t.Run("UID", at.uid)
	t.Run("EnvVars", at.envVars)
	t.Run("ConcurrentJobs", at.concurrentJobs)
	t.Run("NoGatewayLoopback", at.noGatewayLoopback)
	t.Run("GatewayHostDenied", func(t *testing.T) {
		t.Run("IPv4", at.gatewayHostDenied)
		t.Run("IPv6", at.floor6)
	})
	if mode == modeKernel {
		t.Run("FloorIPv4Embedded", at.floorIPv4Embedded)
	}

	// The built-in floor without a config file is the conformance
	// suite's (internal/forward/forwardtest, testFloor), in every mode.

	t.Run("DirectBlocked", at.directBlocked)
	t.Run("Failures", at.failures)
	t.Run("TokenLifecycle", at.tokenLifecycle)

	// seen maps outside source ports the jobs used to their job ids, for
	// whois after the restart; seenAt is a time when both jobs ran.
	at.seen = map[uint16]string{}
	t.Run("PortBlocks", func(t *testing.T) {
		t.Run("IPv4", at.portBlocks)
		t.Run("IPv6", at.portBlocks6)
	})
	t.Run("Flows", at.flows6)
	t.Run("Expose", func(t *testing.T) {
		t.Run("IPv4", func(t *testing.T) { checkExpose(t, at.e) })
		t.Run("IPv6", at.expose6)
	})

	t.Run("Restart", at.restart)
}

// airlockTest is what testAirlock's subtests share.
type airlockTest struct {
	e        *env
	mode     string
	gwTunnel netip.Addr
	seen     map[uint16]string
	seenAt   time.Time
	job6     job6 // the job's IPv6 side, from JobNetwork/IPv6
}

// forFamilies runs fn(t, f) as the subtest name/IPv4 and name/IPv6.
func forFamilies(t *testing.T, name string, fn func(*testing.T, *ipfamily.Family)) {
	t.Run(name, func(t *testing.T) {
		for _, f := range ipfamily.All {
			t.Run(f.Name, func(t *testing.T) { fn(t, f) })
		}
	})
}

// stateDir is testAirlock's subtest StateDir.
func (at *airlockTest) stateDir(t *testing.T) {
	fi, err := os.Stat(at.e.state)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode = %v, want 0700", fi.Mode().Perm())
	}
	want := 0 // kernel mode: the gateway runs as root
	if at.e.gwUser != nil {
		want = at.e.gwUser.UID
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != want {
		t.Errorf("state dir owner = %d, want %d (the gateway's user)", uid, want)
	}
}

// tcpStack is testAirlock's subtest TCPStack.
func (at *airlockTest) tcpStack(t *testing.T) {
	// What terminates the jobs' TCP, as the gateway logs it at start.
	want := map[string]string{
		modeUser:         `tcp="kernel (IPv4), netstack (IPv6)"`,
		modeUserNetstack: `tcp=netstack`,
	}[at.mode]
	if want != "" && !strings.Contains(at.e.gw.Stderr(), want) {
		t.Errorf("gateway log does not say %s%s", want, at.e.diag(""))
	}
}

// jobNetwork is testAirlock's subtest JobNetwork.
func (at *airlockTest) jobNetwork(t *testing.T) {
	out := at.e.mustRun(t, "sh", "-c", "ip -o link show; echo ==; ip -4 -o addr show tun0; echo ==; ip route show default; echo ==; cat /etc/resolv.conf")
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
	at.gwTunnel = a
}

// Per family (by ipfamily.Family.Index): inet's address, the zone's name
// of inet with that family's address alone, and how many datagrams
// UDPEcho sends.
var (
	inetName    = [ipfamily.N]string{zoneName, zoneV6}
	udpEchoSize = [ipfamily.N]int{1000, 300}
)

// inetAddr is inet's address of family f.
func (e *env) inetAddr(f *ipfamily.Family) netip.Addr {
	return [ipfamily.N]netip.Addr{e.tp.INETAddr, topology.INETAddr6}[f.Index]
}

// httpByName100MiB is testAirlock's subtest HTTPByName100MiB: 100 MiB by
// a name with an address of f alone.
func (at *airlockTest) httpByName100MiB(t *testing.T, f *ipfamily.Family) {
	url := fmt.Sprintf("http://%s:%d/big", inetName[f.Index], at.e.httpPort)
	start := time.Now()
	out := at.e.mustRun(t, "bash", "-c", "set -o pipefail; curl -sS --max-time 60 "+url+" | sha256sum")
	d := time.Since(start)
	if got := strings.Fields(out); len(got) == 0 || got[0] != at.e.sha["big"] {
		t.Fatalf("sha256 of %s = %q, want %s", url, out, at.e.sha["big"])
	}
	t.Logf("100 MiB by name over %s in %v (%.0f Mbit/s including join)", f.Name, d.Round(time.Millisecond), float64(bigSize)*8/d.Seconds()/1e6)
}

// udpEcho is testAirlock's subtest UDPEcho: udpEchoSize datagrams echoed
// by inet's address of f.
func (at *airlockTest) udpEcho(t *testing.T, f *ipfamily.Family) {
	n := strconv.Itoa(udpEchoSize[f.Index])
	ap := netip.AddrPortFrom(at.e.inetAddr(f), uint16(at.e.udpPort)).String()
	code, out, stderr := at.e.run(t, at.e.peer, "udpclient", ap, n)
	if code != 0 || strings.TrimSpace(out) != "ok "+n {
		t.Fatalf("udpclient %s %s: exit %d, %q%s%s", ap, n, code, out, at.e.diag(stderr), at.e.netState(t))
	}
	if stderr != "" {
		t.Logf("udpclient: %s", stderr)
	}
}

// dns is testAirlock's subtest DNS.
func (at *airlockTest) dns(t *testing.T) {
	want := at.e.tp.INETAddr.String()
	if out := at.e.mustRun(t, "dig", "+short", "+time=2", "+tries=2", zoneName); strings.TrimSpace(out) != want {
		t.Errorf("dig +short %s = %q, want %s", zoneName, out, want)
	}
	if out := at.e.mustRun(t, "dig", "+short", "+tcp", "+time=2", "+tries=2", zoneName); strings.TrimSpace(out) != want {
		t.Errorf("dig +short +tcp %s = %q, want %s", zoneName, out, want)
	}
	if out := at.e.mustRun(t, "getent", "hosts", zoneName); !strings.HasPrefix(out, want+" ") {
		t.Errorf("getent hosts %s = %q, want %s first", zoneName, out, want)
	}
	if code, out, stderr := at.e.run(t, "getent", "hosts", "nxdomain.airlock.test"); code != 2 {
		t.Errorf("getent hosts nxdomain.airlock.test: exit %d, %q, want 2 (not found)%s", code, out, at.e.diag(stderr))
	}
}

// ping is testAirlock's subtest Ping.
func (at *airlockTest) ping(t *testing.T) {
	if isUserMode(at.mode) && !strings.Contains(at.e.gw.Stderr(), "relayed through ping sockets") {
		t.Errorf("user-mode gateway did not log that ping is relayed (dmz's ping_group_range includes its group)%s", at.e.diag(""))
	}
	targets := []struct {
		name  string
		addr  netip.Addr
		count string
	}{{"inet", at.e.tp.INETAddr, "3"}}
	if at.gwTunnel.IsValid() {
		targets = append(targets, struct {
			name  string
			addr  netip.Addr
			count string
		}{"gateway tunnel address", at.gwTunnel, "1"})
	}
	for _, tc := range targets {
		code, out, stderr := at.e.run(t, "ping", "-n", "-c", tc.count, "-W", "2", tc.addr.String())
		if code != 0 {
			t.Errorf("ping -c %s %s (%s): exit %d, %q%s", tc.count, tc.addr, tc.name, code, out, at.e.diag(stderr))
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
	if !at.gwTunnel.IsValid() {
		t.Error("gateway tunnel address unknown (JobNetwork failed); not pinged")
	}

	// iputils ping falls back to a raw socket through its cap_net_raw
	// file capability, which holds in the job's user namespace. A copy
	// without it needs the ICMP ping socket that airlock run allows in
	// the job's network namespace (net.ipv4.ping_group_range).
	want := fmt.Sprintf("%d\t%d", at.e.u.GID, at.e.u.GID)
	if out := at.e.mustRun(t, "cat", "/proc/sys/net/ipv4/ping_group_range"); strings.TrimSpace(out) != want {
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
	code, out, stderr := at.e.run(t, nocaps, "-n", "-c", "1", "-W", "2", at.e.tp.INETAddr.String())
	if code != 0 || !strings.Contains(out, "1 received") {
		t.Errorf("ping without capabilities (ping socket) to %s: exit %d, %q%s", at.e.tp.INETAddr, code, out, at.e.diag(stderr))
	}
}

// exitStatus is testAirlock's subtest ExitStatus.
func (at *airlockTest) exitStatus(t *testing.T) {
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
			before := at.e.snapshot()
			code, out, stderr := at.e.run(t, tc.args...)
			if code != tc.want {
				t.Errorf("airlock run -- %s: exit %d, want %d; stdout %q%s", strings.Join(tc.args, " "), code, tc.want, out, at.e.diag(stderr))
			}
			at.e.checkNoLeftovers(t, before, "airlock run -- "+strings.Join(tc.args, " "))
		})
	}
}

// sigtermReachesJob is testAirlock's subtest SIGTERMReachesJob.
func (at *airlockTest) sigtermReachesJob(t *testing.T) {
	before := at.e.snapshot()
	p := at.e.start(t, "sh", "-c", `trap "exit 42" TERM; echo ready; i=0; while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; exit 7`)
	if !p.WaitStdout("ready", 30*time.Second) {
		if ok, code := p.Exited(); ok {
			t.Fatalf("job exited %d before it was ready: stdout %q%s", code, p.Stdout(), at.e.diag(p.Stderr()))
		}
		t.Fatalf("job not ready after 30 s%s", at.e.diag(p.Stderr()))
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(15 * time.Second)
	if err != nil {
		t.Fatalf("airlock run did not exit within 15 s of SIGTERM%s", at.e.diag(p.Stderr()))
	}
	if code != 42 {
		t.Errorf("exit %d after SIGTERM, want 42 (the job's trap)%s", code, at.e.diag(p.Stderr()))
	}
	at.e.checkNoLeftovers(t, before, "SIGTERM")
}

// uid is testAirlock's subtest UID.
func (at *airlockTest) uid(t *testing.T) {
	out := at.e.mustRun(t, "sh", "-c", "id -u; id -g")
	want := fmt.Sprintf("%d\n%d\n", at.e.u.UID, at.e.u.GID)
	if out != want {
		t.Errorf("id -u; id -g inside the job = %q, want %q", out, want)
	}
}

// envVars is testAirlock's subtest EnvVars.
func (at *airlockTest) envVars(t *testing.T) {
	code, out, stderr := at.e.runWith(t, runOpts{viaEnv: true}, "sh", "-c", "echo ok")
	if code != 0 || out != "ok\n" {
		t.Errorf("with AIRLOCK_GATEWAY/PIN/TOKEN: exit %d, %q%s", code, out, at.e.diag(stderr))
	}
}

// concurrentJobs is testAirlock's subtest ConcurrentJobs.
func (at *airlockTest) concurrentJobs(t *testing.T) {
	url := fmt.Sprintf("http://%s:%d/small", zoneName, at.e.httpPort)
	script := "set -o pipefail; ip -4 -o addr show tun0; curl -sS --max-time 60 " + url + " | sha256sum; sleep 0.5"
	p1 := at.e.start(t, "bash", "-c", script)
	p2 := at.e.start(t, "bash", "-c", script)
	var addrs []netip.Addr
	for i, p := range []*topology.Process{p1, p2} {
		code, err := p.Wait(runTimeout)
		if err != nil || code != 0 {
			t.Fatalf("job %d: exit %d (%v), stdout %q%s", i+1, code, err, p.Stdout(), at.e.diag(p.Stderr()))
		}
		a, ok := tunAddr(p.Stdout())
		if !ok || !tunnelPrefix.Contains(a) {
			t.Errorf("job %d: no tun0 address in %v: %q", i+1, tunnelPrefix, p.Stdout())
		}
		if !strings.Contains(p.Stdout(), at.e.sha["small"]) {
			t.Errorf("job %d: fetch of %s: %q, want sha256 %s", i+1, url, p.Stdout(), at.e.sha["small"])
		}
		addrs = append(addrs, a)
	}
	if addrs[0] == addrs[1] {
		t.Errorf("both concurrent jobs got %v; want distinct addresses", addrs[0])
	}
}

// noGatewayLoopback is testAirlock's subtest NoGatewayLoopback.
func (at *airlockTest) noGatewayLoopback(t *testing.T) {
	if !at.gwTunnel.IsValid() {
		t.Skip("gateway tunnel address unknown (JobNetwork failed)")
	}
	port := uint16(at.e.tp.Port())
	lo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
	at.e.tp.StartTCPListener(t, at.e.tp.DMZ, lo)
	for _, target := range []netip.AddrPort{lo, netip.AddrPortFrom(at.gwTunnel, port)} {
		code, out, stderr := at.e.run(t, at.e.peer, "tcpcheck", target.String())
		if code == 0 {
			t.Errorf("job connected to %v, which leads to dmz's 127.0.0.1:%d; want failure%s", target, port, at.e.diag(stderr))
		} else if code != 1 {
			t.Errorf("tcpcheck %v: exit %d, want 1 (connect failed): %q%s", target, code, out, at.e.diag(stderr))
		}
	}
	// A shell /dev/tcp connect to the gateway's tunnel address fails, and
	// quickly (refused, not a 5 s timeout).
	start := time.Now()
	code, _, stderr := at.e.run(t, "timeout", "5", "bash", "-c", fmt.Sprintf("echo hi > /dev/tcp/%s/%d", at.gwTunnel, port))
	d := time.Since(start)
	if code == 0 || code == 124 {
		t.Errorf("/dev/tcp/%s/%d: exit %d after %v, want a quick failure (not 0, not 124 = timed out)%s", at.gwTunnel, port, code, d, at.e.diag(stderr))
	}
	t.Logf("/dev/tcp to the gateway's tunnel address: exit %d in %v", code, d.Round(time.Millisecond))
}

// gatewayHostDenied is testAirlock's subtest GatewayHostDenied.
func (at *airlockTest) gatewayHostDenied(t *testing.T) {
	// Default policy denies the gateway host itself, on all its addresses.
	port := uint16(at.e.tp.Port())
	at.e.tp.StartTCPListener(t, at.e.tp.DMZ, netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	targets := []netip.AddrPort{
		netip.AddrPortFrom(at.e.tp.DMZAddrCN, port),
		netip.AddrPortFrom(at.e.tp.DMZAddrINET, port),
	}
	if at.gwTunnel.IsValid() {
		targets = append(targets, netip.AddrPortFrom(at.gwTunnel, port))
	}
	for _, target := range targets {
		if !at.e.tp.TCPCheck(t, at.e.tp.DMZ, nil, target) && target.Addr() != at.gwTunnel {
			t.Fatalf("listener not reachable from dmz at %v", target)
		}
		if code, _, stderr := at.e.run(t, at.e.peer, "tcpcheck", target.String()); code == 0 {
			t.Errorf("job connected to the gateway host at %v; want denied (DESIGN.md: policy's safe defaults deny the gateway host itself)%s", target, at.e.diag(stderr))
		}
	}
}

// directBlocked is testAirlock's subtest DirectBlocked.
func (at *airlockTest) directBlocked(t *testing.T) {
	web := netip.AddrPortFrom(at.e.tp.INETAddr, uint16(at.e.httpPort))
	if at.e.tp.TCPCheck(t, at.e.tp.CN, at.e.u, web) {
		t.Fatalf("cn reached %v without airlock; the topology is not isolated", web)
	}
}

// failures is testAirlock's subtest Failures.
func (at *airlockTest) failures(t *testing.T) {
	closed := netip.AddrPortFrom(at.e.tp.DMZAddrCN, gatewayPort+1).String()
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
			before := at.e.snapshot()
			start := time.Now()
			code, out, stderr := at.e.runWith(t, tc.o, "sh", "-c", "echo job-ran")
			if code != 125 {
				t.Errorf("exit %d, want 125 (airlock's own failure)%s", code, at.e.diag(stderr))
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
			at.e.checkNoLeftovers(t, before, tc.name)
		})
	}
}

// tokenLifecycle is testAirlock's subtest TokenLifecycle.
func (at *airlockTest) tokenLifecycle(t *testing.T) {
	tok := at.e.createToken(t, "e2e-revoke")
	code, out, stderr := at.e.admin(t, "token", "list", "--state", at.e.state)
	if code != 0 || !strings.Contains(out, "e2e-revoke") || !strings.Contains(out, "e2e") {
		t.Errorf("token list: exit %d, %q, want both tokens listed%s", code, out, at.e.diag(stderr))
	}
	if strings.Contains(out, tok) {
		t.Errorf("token list shows the secret token itself: %q", out)
	}
	if code, out, stderr := at.e.runWith(t, runOpts{token: tok}, "true"); code != 0 {
		t.Fatalf("run with new token: exit %d, %q%s", code, out, at.e.diag(stderr))
	}
	if code, out, stderr := at.e.admin(t, "token", "revoke", "--state", at.e.state, "e2e-revoke"); code != 0 {
		t.Fatalf("token revoke: exit %d, %q%s", code, out, at.e.diag(stderr))
	}
	code, _, stderr = at.e.runWith(t, runOpts{token: tok, timeout: 40 * time.Second}, "true")
	if code != 125 || !regexp.MustCompile(`(?i)token`).MatchString(stderr) {
		t.Errorf("run with revoked token: exit %d, want 125 with a message about the token%s", code, at.e.diag(stderr))
	}
	// The other token still works.
	if code, _, stderr := at.e.run(t, "true"); code != 0 {
		t.Errorf("run with the unrevoked token after a revoke: exit %d%s", code, at.e.diag(stderr))
	}
}

// portBlocks is testAirlock's subtest PortBlocks.
func (at *airlockTest) portBlocks(t *testing.T) {
	at.seen, at.seenAt = checkPortBlocks(t, at.e)
}

// restart is testAirlock's subtest Restart.
func (at *airlockTest) restart(t *testing.T) {
	checkRestart(t, at.e, at.seen, at.seenAt)
	// The restarted gateway lives as long as this subtest (kernel
	// mode's check ends with it stopped, to see its clean-up).
	if at.job6.addr.IsValid() && at.mode != modeKernel {
		t.Run("IPv6", func(t *testing.T) { checkIPv6AfterRestart(t, at.e, at.job6.addr) })
	}
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

// job6 is what a dual-stack job sees of its IPv6 side.
type job6 struct {
	addr, gw netip.Prefix // tun0's IPv6 address; the resolv.conf's IPv6 nameserver as a /128
}

// jobIPv6 reads the job's IPv6 address, IPv6 default route and IPv6
// nameserver, and fails the test if the job has no IPv6 address (every
// egress mode carries IPv6).
func jobIPv6(t *testing.T, e *env) job6 {
	t.Helper()
	out := e.mustRun(t, "sh", "-c", "ip -6 -o addr show dev tun0 scope global; echo ==; ip -6 route show default; echo ==; cat /etc/resolv.conf")
	parts := strings.Split(out, "==\n")
	if len(parts) != 3 {
		t.Fatalf("unexpected output %q", out)
	}
	m := regexp.MustCompile(`inet6 (\S+)`).FindStringSubmatch(parts[0])
	if m == nil {
		t.Fatalf("job's tun0 has no global IPv6 address: %q%s", parts[0], e.diag(""))
	}
	var j job6
	var err error
	if j.addr, err = netip.ParsePrefix(m[1]); err != nil || !j.addr.Addr().Is6() {
		t.Fatalf("tun0 IPv6 address %q: %v", m[1], err)
	}
	if !j.addr.Addr().IsPrivate() {
		t.Errorf("job's IPv6 address %v, want one of the gateway's unique-local prefix (fd00::/8)", j.addr)
	}
	if !strings.Contains(parts[1], "default") || !strings.Contains(parts[1], "dev tun0") {
		t.Errorf("IPv6 default route %q, want default dev tun0", parts[1])
	}
	ns := regexp.MustCompile(`(?m)^nameserver\s+(\S+)`).FindAllStringSubmatch(parts[2], -1)
	if len(ns) < 2 {
		t.Fatalf("job resolv.conf has %d nameservers, want the gateway's IPv4 and IPv6 tunnel addresses:\n%s", len(ns), parts[2])
	}
	gw, err := netip.ParseAddr(ns[1][1])
	if err != nil || !gw.Is6() || !j.addr.Masked().Contains(gw) {
		t.Errorf("second nameserver %q, want the gateway's IPv6 tunnel address in %v", ns[1][1], j.addr.Masked())
	}
	j.gw = netip.PrefixFrom(gw, 128)
	return j
}

// need6 skips the test if JobNetwork/IPv6 found no IPv6 side of the job.
func (at *airlockTest) need6(t *testing.T) {
	if !at.job6.addr.IsValid() {
		t.Skip("the job's IPv6 address is unknown (JobNetwork/IPv6 failed)")
	}
}

// httpByNameDualStack is testAirlock's subtest HTTPByNameDualStack: a
// name with both families' addresses is fetched, over IPv6 first.
func (at *airlockTest) httpByNameDualStack(t *testing.T) {
	url := fmt.Sprintf("http://%s:%d/small", zoneDual, at.e.httpPort)
	out := at.e.mustRun(t, "bash", "-c", "set -o pipefail; curl -sS --max-time 30 "+url+" | sha256sum")
	if got := strings.Fields(out); len(got) == 0 || got[0] != at.e.sha["small"] {
		t.Fatalf("sha256 of %s = %q, want %s", url, out, at.e.sha["small"])
	}
	// getaddrinfo puts IPv6 first (the job's gai.conf), and curl,
	// given a head start long enough for a loaded machine, connects
	// over it (its default 200 ms race may go to IPv4 under load).
	if out := at.e.mustRun(t, "getent", "ahosts", zoneDual); !strings.HasPrefix(out, topology.INETAddr6.String()+" ") {
		t.Errorf("getent ahosts %s = %q, want %v first", zoneDual, out, topology.INETAddr6)
	}
	code, out, stderr := at.e.run(t, "curl", "-sS", "--max-time", "30", "--happy-eyeballs-timeout-ms", "5000", "-o", "/dev/null", "-w", "%{remote_ip}", url)
	if code != 0 || strings.TrimSpace(out) != topology.INETAddr6.String() {
		t.Errorf("curl %s: exit %d, remote ip %q, want %v (IPv6 first)%s", url, code, out, topology.INETAddr6, at.e.diag(stderr))
	}
}

// iperf3IPv6 is testAirlock's subtest Iperf3IPv6BothWays (IPv4's, with
// a native comparison, is TestIperf3).
func (at *airlockTest) iperf3IPv6(t *testing.T) {
	port := at.e.tp.StartIperf3Server(t)
	for _, reverse := range []bool{false, true} {
		args := []string{"iperf3", "-6", "-c", topology.INETAddr6.String(), "-p", strconv.Itoa(port), "-t", "1", "--json", "--connect-timeout", "5000"}
		if reverse {
			args = append(args, "-R")
		}
		code, out, stderr := at.e.run(t, args...)
		bps := parseIperf(t, fmt.Sprintf("reverse=%v", reverse), code, out, stderr, at.e.diag(stderr))
		t.Logf("%s mode: iperf3 -6 -t 1 reverse=%v: %.0f Mbit/s", at.e.mode, reverse, bps/1e6)
	}
}

// dns6 is testAirlock's subtest DNS/IPv6: AAAA answers, the resolver on
// the gateway's IPv6 tunnel address (UDP and TCP), getaddrinfo of a name
// with an IPv6 address alone.
func (at *airlockTest) dns6(t *testing.T) {
	at.need6(t)
	if out := at.e.mustRun(t, "dig", "+short", "+time=2", "+tries=2", "AAAA", zoneDual); strings.TrimSpace(out) != topology.INETAddr6.String() {
		t.Errorf("dig AAAA %s = %q, want %s", zoneDual, out, topology.INETAddr6)
	}
	// The gateway's IPv6 tunnel address answers too, UDP and TCP.
	for _, tcp := range []string{"+notcp", "+tcp"} {
		if out := at.e.mustRun(t, "dig", "@"+at.job6.gw.Addr().String(), tcp, "+short", "+time=2", "+tries=2", zoneName); strings.TrimSpace(out) != at.e.tp.INETAddr.String() {
			t.Errorf("dig @%s %s %s = %q, want %s", at.job6.gw.Addr(), tcp, zoneName, out, at.e.tp.INETAddr)
		}
	}
	if out := at.e.mustRun(t, "getent", "ahosts", zoneV6); !strings.HasPrefix(out, topology.INETAddr6.String()+" ") {
		t.Errorf("getent ahosts %s = %q, want %s", zoneV6, out, topology.INETAddr6)
	}
}

// ping6 is testAirlock's subtest Ping/IPv6 (kernel mode): inet, and the
// gateway's IPv6 tunnel address (the job's second nameserver), which the
// gateway host answers itself, through the host's forwarding.
func (at *airlockTest) ping6(t *testing.T) {
	// inet, and the gateway's IPv6 tunnel address (the job's second
	// nameserver), which the gateway host answers itself.
	out := at.e.mustRun(t, "sh", "-c", "ping -6 -c 2 -i 0.2 -W 2 "+topology.INETAddr6.String()+" && "+
		"ping -6 -c 1 -W 2 $(awk '/^nameserver .*:/ {print $2; exit}' /etc/resolv.conf)")
	if n := strings.Count(out, " 0% packet loss"); n != 2 {
		t.Errorf("ping -6 to inet and to the gateway's IPv6 tunnel address: %q", out)
	}
}

// packetTooBig is testAirlock's subtest PacketTooBig (kernel mode): a
// packet too big from the gateway reaches the job (IPv6 path MTU
// discovery).
func (at *airlockTest) packetTooBig(t *testing.T) {
	// dmz's side of its link to inet narrowed to the IPv6 minimum:
	// the gateway answers a larger packet from a job with packet too
	// big, which the job's kernel takes as its path MTU. (A packet
	// too big from a router beyond the gateway, through the NAT:
	// internal/forward/kernel TestIPv6Traffic.)
	_, mtu, _ := at.e.tp.Run(t, 10*time.Second, at.e.tp.DMZ, nil, "cat", "/sys/class/net/"+topology.IfDMZToINET+"/mtu")
	if code, _, stderr := at.e.tp.Run(t, 10*time.Second, at.e.tp.DMZ, nil, "ip", "link", "set", topology.IfDMZToINET, "mtu", "1280"); code != 0 {
		t.Fatalf("mtu 1280 on %s: %s", topology.IfDMZToINET, stderr)
	}
	t.Cleanup(func() {
		at.e.tp.Run(t, 10*time.Second, at.e.tp.DMZ, nil, "ip", "link", "set", topology.IfDMZToINET, "mtu", strings.TrimSpace(mtu))
	})
	a := topology.INETAddr6.String()
	code, out, stderr := at.e.run(t, "sh", "-c", "ping -6 -c 3 -i 0.3 -W 1 -M do -s 1300 "+a+"; ip -6 route get "+a+"; ping -6 -c 1 -W 2 -M do -s 1200 "+a)
	if !regexp.MustCompile(`mtu 1280`).MatchString(out) {
		t.Errorf("after a 1348-byte ping over a 1280 link, the job's route to %s has no mtu 1280 (exit %d): %q%s", a, code, out, at.e.diag(stderr))
	}
	if !strings.Contains(out, "1 received") {
		t.Errorf("a ping that fits the path MTU got no answer: %q", out)
	}
}

// floor6 is testAirlock's subtest GatewayHostDenied/IPv6.
func (at *airlockTest) floor6(t *testing.T) {
	at.need6(t)
	// The gateway host's own IPv6 addresses, another tunnel address,
	// unique-local and link-local destinations: refused at connect.
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(topology.DMZAddrCN6, gatewayPort),
		netip.AddrPortFrom(topology.DMZAddrINET6, gatewayPort),
		netip.AddrPortFrom(at.job6.addr.Addr().Next(), 80),
		netip.AddrPortFrom(netip.MustParseAddr("fd00::1"), 80),
		netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), 80),
	} {
		if code, out, _ := at.e.run(t, at.e.peer, "tcpcheck", dst.String()); code == 0 {
			t.Errorf("job reached %v over IPv6: %q", dst, out)
		}
	}
}

// floorIPv4Embedded is testAirlock's subtest FloorIPv4Embedded (kernel
// mode): IPv6 addresses that embed IPv4 ones (NAT64, 6to4 and Teredo
// images of the floor and of protected ranges) and unique-local ones are
// refused at once, with a reset.
func (at *airlockTest) floorIPv4Embedded(t *testing.T) {
	// Each refused at once with a reset (curl: 7, could not connect),
	// not by a timeout.
	for _, dst := range []string{
		"[64:ff9b::7f00:1]:80",    // NAT64 of loopback: floor
		"[2002:6440:2::1]:80",     // 6to4 of the tunnel subnet: floor
		"[fd00:dead::1]:80",       // unique-local: builtin-private
		"[64:ff9b::a9fe:a9fe]:80", // NAT64 of the metadata endpoint
		"[2001:0:a00:1::1]:80",    // Teredo, server in 10/8: builtin-private
	} {
		start := time.Now()
		code, _, stderr := at.e.run(t, "curl", "-sS", "--max-time", "5", "http://"+dst+"/")
		if d := time.Since(start); code != 7 || d > 4*time.Second {
			t.Errorf("curl %s: exit %d after %v, want 7 (refused) at once%s", dst, code, d.Round(time.Millisecond), at.e.diag(stderr))
		}
	}
}

// portBlocks6 is testAirlock's subtest PortBlocks/IPv6: a job's IPv6
// connections leave from the gateway's IPv6 egress address within its
// port block, and whois names it.
func (at *airlockTest) portBlocks6(t *testing.T) {
	at.need6(t)
	port := at.e.tp.StartTCPSrcPort(t)
	srv := netip.AddrPortFrom(topology.INETAddr6, uint16(port)).String()
	const job = "e2e-ipv6-block"
	p := at.e.startWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + job}}, "sh", "-c", at.e.peer+" tcpsrcclient "+srv+" 3 && sleep 1")
	code, err := p.Wait(runTimeout)
	if err != nil || code != 0 {
		t.Fatalf("job: exit %d (%v), stdout %q%s", code, err, p.Stdout(), at.e.diag(p.Stderr()))
	}
	during := time.Now().Add(-500 * time.Millisecond)
	lines := strings.Fields(p.Stdout())
	if len(lines) != 3 {
		t.Fatalf("%d answers, want 3: %q", len(lines), p.Stdout())
	}
	for _, l := range lines {
		ap, err := netip.ParseAddrPort(l)
		if err != nil {
			t.Fatalf("bad answer %q", l)
		}
		if ap.Addr() != topology.DMZAddrINET6 {
			t.Errorf("connection came from %v, want the gateway's IPv6 egress address %v", ap.Addr(), topology.DMZAddrINET6)
		}
		recs := at.e.whois(t, ap, during)
		if len(recs) != 1 || recs[0].JobID != job {
			t.Errorf("whois %v: got %+v, want exactly job %s", ap, recs, job)
			continue
		}
		if a, _ := attributionAt(recs, ap.Addr()); a.Addr != ap.Addr() || ap.Port() < a.PortLo || ap.Port() > a.PortHi {
			t.Errorf("port %d outside the job's block %+v", ap.Port(), a)
		}
		if len(recs[0].TunnelAddrs) != 2 || !at.job6.addr.Masked().Contains(recs[0].TunnelAddrs[1]) {
			t.Errorf("whois record's tunnel addresses %v, want an IPv6 one of %v", recs[0].TunnelAddrs, at.job6.addr.Masked())
		}
	}
}

// flows6 is testAirlock's subtest Flows: a job's IPv6 download has its
// flow record (IPv4's flow records: TestFlows).
func (at *airlockTest) flows6(t *testing.T) {
	const job = "e2e-ipv6-flows"
	url := fmt.Sprintf("http://[%s]:%d/small", topology.INETAddr6, at.e.httpPort)
	if code, _, stderr := at.e.runWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + job}}, "curl", "-sS", "--max-time", "30", "-o", "/dev/null", url); code != 0 {
		t.Fatalf("curl %s: exit %d%s", url, code, at.e.diag(stderr))
	}
	dst := netip.AddrPortFrom(topology.INETAddr6, uint16(at.e.httpPort)).String()
	var rec *flows.Record
	topology.Poll(10*time.Second, func() bool {
		for _, r := range at.e.flows(t, job).Recent {
			if r.Dst == dst && r.JobID == job {
				rec = &r
				return true
			}
		}
		return false
	})
	if rec == nil {
		t.Fatalf("no flow record of job %s to %s%s", job, dst, at.e.diag(""))
	}
	if rec.BytesIn < smallSize {
		t.Errorf("flow to %s: %d bytes in, want at least %d", dst, rec.BytesIn, smallSize)
	}
}

// expose6 is testAirlock's subtest Expose/IPv6: an exposed port on the
// gateway's IPv6 address, and airlock status naming the job's IPv6
// address.
func (at *airlockTest) expose6(t *testing.T) {
	at.need6(t)
	x := at.e.startExposed(t, "v6", "--expose", "8080")
	defer x.p.Kill()
	ap := netip.AddrPortFrom(topology.DMZAddrINET6, x.tcp.Port())
	code, out, _ := at.e.inetGet(t, "tcpget", ap)
	if code != 0 || !strings.Contains(out, "hello from v6") {
		t.Errorf("tcpget %v (the exposed port on the gateway's IPv6 address): exit %d, %q%s", ap, code, out, at.e.diag(""))
	}
	// airlock status names the running job's IPv6 address.
	found := false
	for _, js := range at.e.status(t).Jobs {
		if js.JobID == "expose-v6" {
			found = true
			if len(js.Addrs) != 2 || !at.job6.addr.Masked().Contains(js.Addrs[1]) {
				t.Errorf("airlock status: job expose-v6 has addresses %v, want an IPv6 one of %v", js.Addrs, at.job6.addr.Masked())
			}
		}
	}
	if !found {
		t.Error("airlock status does not list job expose-v6")
	}
}

// checkIPv6AfterRestart: after a restart the gateway keeps its IPv6
// tunnel prefix (state dir) and jobs reach IPv6 destinations again.
func checkIPv6AfterRestart(t *testing.T, e *env, before netip.Prefix) {
	j := jobIPv6(t, e)
	if before.IsValid() && j.addr.Masked() != before.Masked() {
		t.Errorf("IPv6 tunnel prefix after restart %v, was %v (want it kept in the state dir)", j.addr.Masked(), before.Masked())
	}
	ap := netip.AddrPortFrom(topology.INETAddr6, uint16(e.udpPort)).String()
	if code, out, stderr := e.run(t, e.peer, "udpclient", ap, "10"); code != 0 || strings.TrimSpace(out) != "ok 10" {
		t.Errorf("udpclient %s after restart: exit %d, %q%s", ap, code, out, e.diag(stderr))
	}
}
