// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/topology"
)

// denyUDPPort is a UDP port TestPolicy's config denies.
const denyUDPPort = 7007

// Addresses of TestPolicy's extra destinations, on inet and routed there
// from dmz: a private range (RFC 1918) and the cloud metadata address.
var (
	privateAddr  = netip.MustParseAddr("10.99.0.1")
	metadataAddr = netip.MustParseAddr("169.254.169.254")
)

// policyConfig is TestPolicy's config file: port deny is refused, the
// private address is allowed for the token "lab" only (builtin-private
// refuses it for others), jobs of "lab" may expose 8000-8999/tcp and
// hold at most 2 flows, and extra is appended to the rules (a reload adds
// rules there).
func policyConfig(deny int, extra string) string {
	return fmt.Sprintf(`# TestPolicy
version = 1

[[policy.rule]]
name = "no-port-%d"
action = "deny"
proto = "tcp"
ports = [%d]

[[policy.rule]]
name = "lab-storage"
action = "allow"
to = ["%s/32"]
tokens = ["lab"]
%s
[[policy.rule]]
name = "no-udp-%d"
action = "deny"
proto = "udp"
ports = [%d]

[[policy.rule]]
name = "no-ping-inet"
action = "deny"
proto = "icmp"
to = ["%s"]

[[policy.rule]]
name = "lab-shared"
action = "allow"
to = ["100.64.0.0/10", "192.0.0.0/24"]
tokens = ["lab"]

[[policy.rule]]
name = "lab-ula6"
action = "allow"
to = ["%s"]
tokens = ["lab"]

[[expose]]
tokens = ["lab"]
proto = "tcp"
ports = ["8000-8999"]

[limits.token.lab]
max_flows = 2

# Run at start and at every reload: a file that fails them is refused.
[[policy.test]]
token = "lab"
allow = ["%s:80"]
deny = ["%s:%d"]

[[policy.test]]
deny = ["%s:80", "%s:80"]
`, deny, deny, privateAddr, extra, denyUDPPort, denyUDPPort, topology.INETAddr, ula6Prefix,
		privateAddr, topology.INETAddr, deny, privateAddr, metadataAddr)
}

// TestPolicy runs, in each egress mode (and user mode with either TCP
// stack), a gateway with a config file:
//   - a deny rule refuses a destination port at once (TCP reset), other
//     ports work;
//   - an allow rule scoped to one token opens a private address to that
//     token's jobs only;
//   - the built-in defaults refuse the gateway host's own services (both of
//     its addresses) and 169.254.169.254, although all are listening, and
//     a SYN to 127.0.0.1 sent through the tunnel gets no answer from the
//     gateway's loopback;
//   - exposure is refused for a token without an [[expose]] rule;
//   - a token's own limits apply to its jobs only;
//   - a broken reload (airlock gateway reload) fails with file:line and
//     keeps the old policy; a good one applies a new rule to new flows while
//     a running job's connection and tunnel carry on; SIGHUP reloads too;
//   - a broken config stops a gateway at start with file:line.
func TestPolicy(t *testing.T) {
	for _, mode := range []string{modeUser, modeUserNetstack, modeKernel} {
		t.Run(mode, func(t *testing.T) { testPolicy(t, mode) })
	}
}

func testPolicy(t *testing.T, mode string) {
	pt := &policyTest{mode: mode}
	topology.RequireRoot(t)
	u := topology.EnsureUser(t)
	pt.dir = topology.TempDir(t)
	if isUserMode(mode) {
		if err := os.Chown(pt.dir, u.UID, u.GID); err != nil {
			t.Fatal(err)
		}
	}
	pt.file = filepath.Join(pt.dir, "gateway.toml")
	pt.denyPort = 2525
	pt.write = func(s string) {
		t.Helper()
		if err := os.WriteFile(pt.file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pt.write(policyConfig(pt.denyPort, ""))
	pt.e = newEnvMode(t, mode, "--config", pt.file)
	pt.lab = pt.e.createToken(t, "lab")

	// Destinations: a greeting server on every inet address (also the
	// private and metadata ones) and on every dmz address (the gateway
	// host's own services).
	tp := pt.e.tp
	pt.tp = tp
	for _, a := range []netip.Addr{privateAddr, metadataAddr} {
		mustCmd(t, "ip", "-n", tp.INET, "addr", "add", a.String()+"/32", "dev", topology.IfINETToDMZ)
		mustCmd(t, "ip", "-n", tp.DMZ, "route", "add", a.String()+"/32", "via", tp.INETAddr.String())
	}
	pt.okPort = tp.Port()
	for _, port := range []int{pt.okPort, pt.denyPort} {
		tp.StartTCPListener(t, tp.INET, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port)))
	}
	pt.hostPort = tp.Port()
	tp.StartTCPListener(t, tp.DMZ, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(pt.hostPort)))
	for _, a := range []netip.AddrPort{
		netip.AddrPortFrom(privateAddr, uint16(pt.okPort)), netip.AddrPortFrom(metadataAddr, uint16(pt.okPort)),
		netip.AddrPortFrom(tp.DMZAddrINET, uint16(pt.hostPort)),
	} {
		if !tp.TCPCheck(t, tp.DMZ, nil, a) {
			t.Fatalf("%v does not answer from dmz: the test's destinations are not set up", a)
		}
	}

	// get runs tcpget ADDR in a job of token tok ("" the env's) and
	// reports whether it got the greeting; a refusal must be fast.
	pt.get = func(t *testing.T, tok string, a netip.AddrPort) bool {
		t.Helper()
		start := time.Now()
		code, out, stderr := pt.e.runWith(t, runOpts{token: tok}, pt.e.peer, "tcpget", a.String())
		if code == 0 && out == "hello\n" {
			return true
		}
		if !strings.Contains(stderr, "connection refused") {
			t.Errorf("tcpget %v (token %q): exit %d, %q, want hello or a refusal%s", a, tok, code, out, pt.e.diag(stderr))
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("tcpget %v (token %q): refused after %v, want at once", a, tok, d)
		}
		return false
	}
	pt.inet = func(port int) netip.AddrPort { return netip.AddrPortFrom(tp.INETAddr, uint16(port)) }

	t.Run("DenyRule", pt.denyRule)
	t.Run("UDPAndICMP", pt.udpAndICMP)
	t.Run("TokenScope", pt.tokenScope)
	t.Run("Builtins", pt.builtins)
	t.Run("Floor", pt.floor)
	t.Run("IPv6", func(t *testing.T) { checkPolicyIPv6(t, pt.e, pt.get, pt.lab, pt.okPort, pt.denyPort) })
	t.Run("Expose", pt.expose)

	pt.echo = tp.Port()
	p := tp.Start(t, tp.INET, nil, pt.e.peer, "tcpecho", fmt.Sprintf("0.0.0.0:%d", pt.echo))
	tp.WaitTCP(t, tp.INET, pt.inet(pt.echo), p)
	t.Run("TokenLimits", pt.tokenLimits)
	t.Run("Reload", pt.reload)
	t.Run("BrokenAtStart", pt.brokenAtStart)
}

// policyTest is what testPolicy's subtests share.
type policyTest struct {
	e        *env
	mode     string
	dir      string
	file     string
	denyPort int
	write    func(string)
	lab      string
	tp       *topology.Topology
	okPort   int
	hostPort int
	get      func(*testing.T, string, netip.AddrPort) bool
	inet     func(int) netip.AddrPort
	echo     int
}

// denyRule is testPolicy's subtest DenyRule.
func (pt *policyTest) denyRule(t *testing.T) {
	if !pt.get(t, "", pt.inet(pt.okPort)) {
		t.Errorf("port %d (no rule): refused, want allowed", pt.okPort)
	}
	if pt.get(t, "", pt.inet(pt.denyPort)) {
		t.Errorf("port %d (deny rule): allowed, want refused", pt.denyPort)
	}
	// How fast the job sees the refusal, timed inside the job.
	code, out, stderr := pt.e.run(t, pt.e.peer, "tcpburst", pt.inet(pt.denyPort).String(), "5")
	var ok, failed int
	var ds string
	if _, err := fmt.Sscanf(out, "ok=%d failed=%d slowest_failure=%s", &ok, &failed, &ds); code != 0 || err != nil || ok != 0 || failed != 5 {
		t.Fatalf("5 connections to the denied port: exit %d, %q, want all refused%s", code, out, pt.e.diag(stderr))
	}
	slowest, _ := time.ParseDuration(ds)
	t.Logf("%s mode: 5 connections to a denied port, slowest refusal %v", pt.mode, slowest)
	if slowest >= time.Second {
		t.Errorf("slowest refusal took %v, want < 1 s", slowest)
	}
	// The 6 denials are in the flow table's verdict counts (kernel
	// mode: from the rule's nftables counter, read every second) and,
	// in user mode, in the flow log one by one.
	verdict := fmt.Sprintf("denied:no-port-%d", pt.denyPort)
	var n uint64
	for deadline := time.Now().Add(5 * time.Second); n < 6 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		n = pt.e.status(t).Totals.Verdicts[verdict]
	}
	if n < 6 {
		t.Errorf("airlock status: %s = %d, want at least 6", verdict, n)
	}
	if isUserMode(pt.mode) {
		logged := 0
		for _, r := range readRecords(t, filepath.Join(pt.e.state, gatewayFlowLog)) {
			if r.Verdict == verdict && r.Dst == pt.inet(pt.denyPort).String() {
				logged++
			}
		}
		if logged != 6 {
			t.Errorf("flow log: %d records with verdict %s, want 6", logged, verdict)
		}
	}
}

// udpAndICMP is testPolicy's subtest UDPAndICMP.
func (pt *policyTest) udpAndICMP(t *testing.T) {
	p := pt.tp.Start(t, pt.tp.INET, nil, pt.e.peer, "udpecho", fmt.Sprintf("0.0.0.0:%d", denyUDPPort))
	t.Cleanup(p.Kill)
	if code, out, stderr := pt.e.run(t, pt.e.peer, "udpget", pt.inet(pt.e.udpPort).String()); code != 0 || out == "" {
		t.Errorf("udp to port %d (no rule): exit %d, %q, want an answer%s", pt.e.udpPort, code, out, pt.e.diag(stderr))
	}
	if code, out, _ := pt.e.run(t, pt.e.peer, "udpget", pt.inet(denyUDPPort).String()); code == 0 {
		t.Errorf("udp to port %d (deny rule): answered %q, want dropped", denyUDPPort, out)
	}
	if code, out, _ := pt.e.run(t, "ping", "-n", "-c", "1", "-W", "1", pt.tp.INETAddr.String()); code == 0 {
		t.Errorf("ping %v (deny rule): %q, want no reply", pt.tp.INETAddr, out)
	}
	if code, out, stderr := pt.e.run(t, "ping", "-n", "-c", "1", "-W", "2", metadataAddr.String()); code == 0 {
		t.Errorf("ping %v: %q, want no reply (builtin-link-local)%s", metadataAddr, out, pt.e.diag(stderr))
	}
	if pt.mode != modeKernel {
		return
	}
	// Kernel mode counts in the rules' nftables counters.
	code, out, stderr := pt.tp.Run(t, 10*time.Second, pt.tp.DMZ, nil, "nft", "list", "chain", "inet", "airlock", "egress_policy")
	if code != 0 {
		t.Fatalf("nft list chain inet airlock egress_policy: exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		fmt.Sprintf(`tcp dport %d counter packets [1-9]`, pt.denyPort),
		fmt.Sprintf(`udp dport %d counter packets [1-9]`, denyUDPPort),
		fmt.Sprintf(`ip daddr %s counter packets [1-9]`, pt.tp.INETAddr),
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("nft chain egress_policy lacks %q:\n%s", want, out)
		}
	}
}

// tokenScope is testPolicy's subtest TokenScope.
func (pt *policyTest) tokenScope(t *testing.T) {
	a := netip.AddrPortFrom(privateAddr, uint16(pt.okPort))
	if !pt.get(t, pt.lab, a) {
		t.Errorf("%v for token lab (its allow rule): refused, want allowed", a)
	}
	if pt.get(t, "", a) {
		t.Errorf("%v for token e2e (builtin-private): allowed, want refused", a)
	}
	if pt.get(t, pt.lab, pt.inet(pt.denyPort)) {
		t.Errorf("port %d for token lab: allowed, want refused", pt.denyPort)
	}
}

// builtins is testPolicy's subtest Builtins.
func (pt *policyTest) builtins(t *testing.T) {
	// Loopback: a job's own kernel keeps 127/8 to itself, so the SYN is
	// sent through a packet socket on tun0; a SYN to an inet server
	// shows the method gets answers.
	loPort := pt.tp.Port()
	pt.tp.StartTCPListener(t, pt.tp.DMZ, netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", loPort)))
	raw := rawPeer(t, pt.e.peer)
	for _, tc := range []struct {
		dst  string
		want string
	}{{pt.inet(pt.okPort).String(), "synack"}, {fmt.Sprintf("127.0.0.1:%d", loPort), "none"}} {
		code, out, stderr := pt.e.run(t, raw, "rawsyn", "tun0", tc.dst, "1s")
		if got := strings.TrimSpace(out); code != 0 || got != tc.want && !(tc.want == "none" && got == "rst") {
			t.Errorf("raw SYN to %s: exit %d, %q, want %s%s", tc.dst, code, out, tc.want, pt.e.diag(stderr))
		}
		t.Logf("%s mode: raw SYN to %s: %s", pt.mode, tc.dst, strings.TrimSpace(out))
	}
	for _, a := range []netip.AddrPort{
		netip.AddrPortFrom(pt.tp.DMZAddrINET, uint16(pt.hostPort)),
		netip.AddrPortFrom(pt.tp.DMZAddrCN, uint16(pt.hostPort)),
		netip.AddrPortFrom(metadataAddr, uint16(pt.okPort)),
	} {
		if pt.get(t, pt.lab, a) {
			t.Errorf("%v: allowed, want refused by the built-in defaults", a)
		}
	}
}

// floor is testPolicy's subtest Floor.
func (pt *policyTest) floor(t *testing.T) {
	// An allow rule that names 100.64.0.0/10 and 192.0.0.0/24 opens
	// them for token lab; the metadata endpoint inside needs its own
	// name, and other tokens stay refused.
	port := floorDestinations(t, pt.tp)
	for _, tc := range []struct {
		tok  string
		a    netip.Addr
		want bool
	}{
		{pt.lab, sharedAddr, true}, {pt.lab, ietfProtoAddr, true}, {pt.lab, aliMetaAddr, false},
		{"", sharedAddr, false}, {"", ietfProtoAddr, false},
	} {
		if got := pt.get(t, tc.tok, netip.AddrPortFrom(tc.a, uint16(port))); got != tc.want {
			t.Errorf("%v for token %q: allowed %v, want %v (rule lab-shared names 100.64.0.0/10 and 192.0.0.0/24 for lab)", tc.a, tc.tok, got, tc.want)
		}
	}
}

// expose is testPolicy's subtest Expose.
func (pt *policyTest) expose(t *testing.T) {
	code, _, stderr := pt.e.runWith(t, runOpts{flags: []string{"--expose", "8080"}}, "true")
	if code != 125 || !strings.Contains(stderr, "[[expose]]") {
		t.Errorf("--expose 8080 for token e2e: exit %d, want 125 naming [[expose]]%s", code, pt.e.diag(stderr))
	}
	code, _, stderr = pt.e.runWith(t, runOpts{token: pt.lab, flags: []string{"--expose", "8080"}}, "true")
	if code != 0 {
		t.Errorf("--expose 8080 for token lab: exit %d, want 0%s", code, pt.e.diag(stderr))
	}
	code, _, stderr = pt.e.runWith(t, runOpts{token: pt.lab, flags: []string{"--expose", "9000"}}, "true")
	if code != 125 {
		t.Errorf("--expose 9000 for token lab (outside 8000-8999): exit %d, want 125%s", code, pt.e.diag(stderr))
	}
}

// tokenLimits is testPolicy's subtest TokenLimits.
func (pt *policyTest) tokenLimits(t *testing.T) {
	for _, tc := range []struct {
		tok, want string
	}{{pt.lab, "ok=2 failed=1 "}, {"", "ok=3 failed=0 "}} {
		code, out, stderr := pt.e.runWith(t, runOpts{token: tc.tok}, pt.e.peer, "tcpflows", pt.inet(pt.echo).String(), "3", "0s")
		if code != 0 || !strings.HasPrefix(out, tc.want) {
			t.Errorf("3 connections, token %q: exit %d, %q, want %q (lab: max_flows = 2)%s", tc.tok, code, out, tc.want, pt.e.diag(stderr))
		}
	}
}

// reload is testPolicy's subtest Reload.
func (pt *policyTest) reload(t *testing.T) {
	// A job that holds a connection to the echo server across the
	// reloads and checks that it still echoes at the end, while a
	// reloaded policy that denies the echo port is in force: a reload
	// applies to new flows only.
	held := pt.e.start(t, pt.e.peer, "tcpflows", pt.inet(pt.echo).String(), "1", "4s")
	time.Sleep(time.Second)
	reload := func() (int, string, string) {
		return pt.e.admin(t, "gateway", "reload", "--state", pt.e.state)
	}

	// Broken: the old policy stays.
	pt.write(policyConfig(pt.denyPort, "\n[[policy.rule]]\nname = \"bad\"\naction = \"deny\"\nto = [\"10.0.0.1/8\"]\n"))
	code, out, stderr := reload()
	wantLoc := pt.file + ":19: policy.rule[3].to"
	if code == 0 || !strings.Contains(stderr, wantLoc) {
		t.Errorf("reload of a broken file: exit %d, %q %q, want non-zero naming %s", code, out, stderr, wantLoc)
	}
	if !strings.Contains(pt.e.gw.Stderr(), "config reload failed") {
		t.Errorf("gateway did not log the failed reload%s", pt.e.diag(""))
	}
	check := func(a netip.AddrPort) bool {
		code, _, _ := pt.e.run(t, pt.e.peer, "tcpcheck", a.String())
		return code == 0
	}
	if !check(pt.inet(pt.echo)) || pt.get(t, "", pt.inet(pt.denyPort)) {
		t.Errorf("after the broken reload the old policy is not in force")
	}

	// Valid, but its [[policy.test]] fails: an allow of the private
	// address for every token is refused, and the old policy stays.
	pt.write(policyConfig(pt.denyPort, fmt.Sprintf("\n[[policy.rule]]\nname = \"oops\"\naction = \"allow\"\nto = [\"%s/32\"]\n", privateAddr)))
	code, out, stderr = reload()
	wantTest := fmt.Sprintf(`policy.test[2].deny: tcp to %s:80 for a token no rule names: the policy allows it (rule "oops" decides`, privateAddr)
	if code == 0 || !strings.Contains(stderr, wantTest) {
		t.Errorf("reload of a file whose policy test fails: exit %d, %q %q, want non-zero with %q", code, out, stderr, wantTest)
	}
	if pt.get(t, "", netip.AddrPortFrom(privateAddr, uint16(pt.okPort))) {
		t.Errorf("after the reload whose policy test failed, a job of another token reaches %s", privateAddr)
	}

	// Good: deny the echo port for new flows.
	pt.write(policyConfig(pt.denyPort, fmt.Sprintf("\n[[policy.rule]]\nname = \"no-echo\"\naction = \"deny\"\nproto = \"tcp\"\nports = [%d]\n", pt.echo)))
	code, out, stderr = reload()
	if code != 0 || !strings.Contains(out, "7 policy rules") {
		t.Fatalf("reload: exit %d, %q%s", code, out, pt.e.diag(stderr))
	}
	if check(pt.inet(pt.echo)) {
		t.Errorf("echo port after the reload that denies it: allowed, want refused")
	}
	code, err := held.Wait(60 * time.Second)
	if err != nil || code != 0 || !strings.HasPrefix(held.Stdout(), "ok=1 failed=0 ") || !strings.Contains(held.Stdout(), "alive=1") {
		t.Errorf("job holding a connection across the reloads: exit %d (%v), %q, want its connection alive%s", code, err, held.Stdout(), pt.e.diag(held.Stderr()))
	}
	// SIGHUP: back to the first policy.
	pt.write(policyConfig(pt.denyPort, ""))
	if err := pt.e.gw.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !check(pt.inet(pt.echo)) {
		if time.Now().After(deadline) {
			t.Fatalf("echo port still refused 10 s after SIGHUP%s", pt.e.diag(""))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ok, c := pt.e.gw.Exited(); ok {
		t.Errorf("gateway exited (%d) during the reloads", c)
	}
}

// brokenAtStart is testPolicy's subtest BrokenAtStart.
func (pt *policyTest) brokenAtStart(t *testing.T) {
	bad := filepath.Join(pt.dir, "broken.toml")
	if err := os.WriteFile(bad, []byte("version = 1\n[policy]\ndefault = \"perhaps\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"gateway", "--state", filepath.Join(pt.dir, "state2"), "--config", bad,
		"--listen", netip.AddrPortFrom(pt.tp.DMZAddrCN, gatewayPort+1).String(), "--egress-addr", pt.tp.DMZAddrINET.String()}
	if pt.mode == modeKernel {
		args = append(args, "--egress", "kernel", "--tun", "airlock9")
	}
	code, _, stderr := pt.tp.Run(t, 30*time.Second, pt.tp.DMZ, pt.e.gwUser, pt.e.airlock, args...)
	if want := bad + ":3: policy.default"; code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("gateway with a broken config: exit %d, stderr %q, want a failure naming %s", code, stderr, want)
	}
	if _, err := os.Stat(filepath.Join(pt.dir, "state2")); err == nil {
		t.Error("gateway created its state directory although its config is broken")
	}
	// A config whose policy tests fail does not start the gateway either.
	failing := strings.Replace(policyConfig(pt.denyPort, ""), `deny = ["`+privateAddr.String(), `allow = ["`+privateAddr.String(), 1)
	if err := os.WriteFile(bad, []byte(failing), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = pt.tp.Run(t, 30*time.Second, pt.tp.DMZ, pt.e.gwUser, pt.e.airlock, args...)
	if want := "policy.test[2].allow: tcp to " + privateAddr.String() + ":80"; code == 0 || !strings.Contains(stderr, want) {
		t.Errorf("gateway with a config whose policy test fails: exit %d, stderr %q, want a failure naming %s", code, stderr, want)
	}
}

func mustCmd(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// rawPeer returns a copy of the peer binary with the file capability
// cap_net_raw+ep (as iputils ping has), so that a job may open a packet
// socket in its own network namespace.
func rawPeer(t *testing.T, peer string) string {
	t.Helper()
	b, err := os.ReadFile(peer)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(topology.TempDir(t), "airlock-testpeer-raw")
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// struct vfs_cap_data, revision 2, effective: permitted = CAP_NET_RAW.
	caps := make([]byte, 20)
	binary.LittleEndian.PutUint32(caps[0:], 0x02000000|1)
	binary.LittleEndian.PutUint32(caps[4:], 1<<13)
	if err := unix.Setxattr(path, "security.capability", caps, 0); err != nil {
		t.Fatalf("set cap_net_raw on %s: %v", path, err)
	}
	return path
}

// ula6Prefix is a unique-local prefix on inet that TestPolicy's rule
// lab-ula6 opens for token lab (builtin-private refuses it for others).
var ula6Prefix = netip.MustParsePrefix("fd99:a1::/64")

// checkPolicyIPv6: in every mode, policy rules judge jobs' IPv6 flows: a
// port deny rule without addresses, an IPv6 allow rule scoped to a token
// over builtin-private, and the built-in protection of the gateway host's
// own IPv6 addresses. get runs tcpget in a job of a token.
func checkPolicyIPv6(t *testing.T, e *env, get func(*testing.T, string, netip.AddrPort) bool, lab string, okPort, denyPort int) {
	tp := e.tp
	ula := ula6Prefix.Addr().Next()
	mustCmd(t, "ip", "-n", tp.INET, "-6", "addr", "add", ula.String()+"/128", "dev", topology.IfINETToDMZ, "nodad")
	mustCmd(t, "ip", "-n", tp.DMZ, "-6", "route", "add", ula.String()+"/128", "via", topology.INETAddr6.String())
	for _, port := range []int{okPort, denyPort} {
		tp.StartTCPListener(t, tp.INET, netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(port)))
	}
	hostPort := tp.Port()
	tp.StartTCPListener(t, tp.DMZ, netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(hostPort)))
	inet6 := func(port int) netip.AddrPort { return netip.AddrPortFrom(topology.INETAddr6, uint16(port)) }
	for _, tc := range []struct {
		tok  string
		dst  netip.AddrPort
		want bool
		why  string
	}{
		{"", inet6(okPort), true, "no rule"},
		{"", inet6(denyPort), false, "the deny rule of its port"},
		{lab, netip.AddrPortFrom(ula, uint16(okPort)), true, "lab-ula6 for token lab"},
		{"", netip.AddrPortFrom(ula, uint16(okPort)), false, "builtin-private"},
		{lab, netip.AddrPortFrom(topology.DMZAddrINET6, uint16(hostPort)), false, "builtin-host"},
		{lab, netip.AddrPortFrom(topology.DMZAddrCN6, uint16(hostPort)), false, "builtin-host"},
	} {
		if got := get(t, tc.tok, tc.dst); got != tc.want {
			t.Errorf("%v for token %q: allowed %v, want %v (%s)", tc.dst, tc.tok, got, tc.want, tc.why)
		}
	}
}
