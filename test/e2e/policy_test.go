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
`, deny, deny, privateAddr, extra, denyUDPPort, denyUDPPort, topology.INETAddr, ula6Prefix)
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
	topology.RequireRoot(t)
	u := topology.EnsureUser(t)
	dir := topology.TempDir(t)
	if isUserMode(mode) {
		if err := os.Chown(dir, u.UID, u.GID); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "gateway.toml")
	const denyPort = 2525
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(policyConfig(denyPort, ""))
	e := newEnvMode(t, mode, "--config", file)
	lab := e.createToken(t, "lab")

	// Destinations: a greeting server on every inet address (also the
	// private and metadata ones) and on every dmz address (the gateway
	// host's own services).
	tp := e.tp
	for _, a := range []netip.Addr{privateAddr, metadataAddr} {
		mustCmd(t, "ip", "-n", tp.INET, "addr", "add", a.String()+"/32", "dev", topology.IfINETToDMZ)
		mustCmd(t, "ip", "-n", tp.DMZ, "route", "add", a.String()+"/32", "via", tp.INETAddr.String())
	}
	okPort := tp.Port()
	for _, port := range []int{okPort, denyPort} {
		tp.StartTCPListener(t, tp.INET, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port)))
	}
	hostPort := tp.Port()
	tp.StartTCPListener(t, tp.DMZ, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(hostPort)))
	for _, a := range []netip.AddrPort{
		netip.AddrPortFrom(privateAddr, uint16(okPort)), netip.AddrPortFrom(metadataAddr, uint16(okPort)),
		netip.AddrPortFrom(tp.DMZAddrINET, uint16(hostPort)),
	} {
		if !tp.TCPCheck(t, tp.DMZ, nil, a) {
			t.Fatalf("%v does not answer from dmz: the test's destinations are not set up", a)
		}
	}

	// get runs tcpget ADDR in a job of token tok ("" the env's) and
	// reports whether it got the greeting; a refusal must be fast.
	get := func(t *testing.T, tok string, a netip.AddrPort) bool {
		t.Helper()
		start := time.Now()
		code, out, stderr := e.runWith(t, runOpts{token: tok}, e.peer, "tcpget", a.String())
		if code == 0 && out == "hello\n" {
			return true
		}
		if !strings.Contains(stderr, "connection refused") {
			t.Errorf("tcpget %v (token %q): exit %d, %q, want hello or a refusal%s", a, tok, code, out, e.diag(stderr))
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("tcpget %v (token %q): refused after %v, want at once", a, tok, d)
		}
		return false
	}
	inet := func(port int) netip.AddrPort { return netip.AddrPortFrom(tp.INETAddr, uint16(port)) }

	t.Run("DenyRule", func(t *testing.T) {
		if !get(t, "", inet(okPort)) {
			t.Errorf("port %d (no rule): refused, want allowed", okPort)
		}
		if get(t, "", inet(denyPort)) {
			t.Errorf("port %d (deny rule): allowed, want refused", denyPort)
		}
		// How fast the job sees the refusal, timed inside the job.
		code, out, stderr := e.run(t, e.peer, "tcpburst", inet(denyPort).String(), "5")
		var ok, failed int
		var ds string
		if _, err := fmt.Sscanf(out, "ok=%d failed=%d slowest_failure=%s", &ok, &failed, &ds); code != 0 || err != nil || ok != 0 || failed != 5 {
			t.Fatalf("5 connections to the denied port: exit %d, %q, want all refused%s", code, out, e.diag(stderr))
		}
		slowest, _ := time.ParseDuration(ds)
		t.Logf("%s mode: 5 connections to a denied port, slowest refusal %v", mode, slowest)
		if slowest >= time.Second {
			t.Errorf("slowest refusal took %v, want < 1 s", slowest)
		}
		// The 6 denials are in the flow table's verdict counts (kernel
		// mode: from the rule's nftables counter, read every second) and,
		// in user mode, in the flow log one by one.
		verdict := fmt.Sprintf("denied:no-port-%d", denyPort)
		var n uint64
		for deadline := time.Now().Add(5 * time.Second); n < 6 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			n = e.status(t).Totals.Verdicts[verdict]
		}
		if n < 6 {
			t.Errorf("airlock status: %s = %d, want at least 6", verdict, n)
		}
		if isUserMode(mode) {
			logged := 0
			for _, r := range readRecords(t, filepath.Join(e.state, gatewayFlowLog)) {
				if r.Verdict == verdict && r.Dst == inet(denyPort).String() {
					logged++
				}
			}
			if logged != 6 {
				t.Errorf("flow log: %d records with verdict %s, want 6", logged, verdict)
			}
		}
	})
	t.Run("UDPAndICMP", func(t *testing.T) {
		p := tp.Start(t, tp.INET, nil, e.peer, "udpecho", fmt.Sprintf("0.0.0.0:%d", denyUDPPort))
		t.Cleanup(p.Kill)
		if code, out, stderr := e.run(t, e.peer, "udpget", inet(e.udpPort).String()); code != 0 || out == "" {
			t.Errorf("udp to port %d (no rule): exit %d, %q, want an answer%s", e.udpPort, code, out, e.diag(stderr))
		}
		if code, out, _ := e.run(t, e.peer, "udpget", inet(denyUDPPort).String()); code == 0 {
			t.Errorf("udp to port %d (deny rule): answered %q, want dropped", denyUDPPort, out)
		}
		if code, out, _ := e.run(t, "ping", "-n", "-c", "1", "-W", "1", tp.INETAddr.String()); code == 0 {
			t.Errorf("ping %v (deny rule): %q, want no reply", tp.INETAddr, out)
		}
		if code, out, stderr := e.run(t, "ping", "-n", "-c", "1", "-W", "2", metadataAddr.String()); code == 0 {
			t.Errorf("ping %v: %q, want no reply (builtin-link-local)%s", metadataAddr, out, e.diag(stderr))
		}
		if mode != modeKernel {
			return
		}
		// Kernel mode counts in the rules' nftables counters.
		code, out, stderr := tp.Run(t, 10*time.Second, tp.DMZ, nil, "nft", "list", "chain", "inet", "airlock", "egress_policy")
		if code != 0 {
			t.Fatalf("nft list chain inet airlock egress_policy: exit %d: %s", code, stderr)
		}
		for _, want := range []string{
			fmt.Sprintf(`tcp dport %d counter packets [1-9]`, denyPort),
			fmt.Sprintf(`udp dport %d counter packets [1-9]`, denyUDPPort),
			fmt.Sprintf(`ip daddr %s counter packets [1-9]`, tp.INETAddr),
		} {
			if !regexp.MustCompile(want).MatchString(out) {
				t.Errorf("nft chain egress_policy lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("TokenScope", func(t *testing.T) {
		a := netip.AddrPortFrom(privateAddr, uint16(okPort))
		if !get(t, lab, a) {
			t.Errorf("%v for token lab (its allow rule): refused, want allowed", a)
		}
		if get(t, "", a) {
			t.Errorf("%v for token e2e (builtin-private): allowed, want refused", a)
		}
		if get(t, lab, inet(denyPort)) {
			t.Errorf("port %d for token lab: allowed, want refused", denyPort)
		}
	})
	t.Run("Builtins", func(t *testing.T) {
		// Loopback: a job's own kernel keeps 127/8 to itself, so the SYN is
		// sent through a packet socket on tun0; a SYN to an inet server
		// shows the method gets answers.
		loPort := tp.Port()
		tp.StartTCPListener(t, tp.DMZ, netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", loPort)))
		raw := rawPeer(t, e.peer)
		for _, tc := range []struct {
			dst  string
			want string
		}{{inet(okPort).String(), "synack"}, {fmt.Sprintf("127.0.0.1:%d", loPort), "none"}} {
			code, out, stderr := e.run(t, raw, "rawsyn", "tun0", tc.dst, "1s")
			if got := strings.TrimSpace(out); code != 0 || got != tc.want && !(tc.want == "none" && got == "rst") {
				t.Errorf("raw SYN to %s: exit %d, %q, want %s%s", tc.dst, code, out, tc.want, e.diag(stderr))
			}
			t.Logf("%s mode: raw SYN to %s: %s", mode, tc.dst, strings.TrimSpace(out))
		}
		for _, a := range []netip.AddrPort{
			netip.AddrPortFrom(tp.DMZAddrINET, uint16(hostPort)),
			netip.AddrPortFrom(tp.DMZAddrCN, uint16(hostPort)),
			netip.AddrPortFrom(metadataAddr, uint16(okPort)),
		} {
			if get(t, lab, a) {
				t.Errorf("%v: allowed, want refused by the built-in defaults", a)
			}
		}
	})
	t.Run("Floor", func(t *testing.T) {
		// An allow rule that names 100.64.0.0/10 and 192.0.0.0/24 opens
		// them for token lab; the metadata endpoint inside needs its own
		// name, and other tokens stay refused.
		port := floorDestinations(t, tp)
		for _, tc := range []struct {
			tok  string
			a    netip.Addr
			want bool
		}{
			{lab, sharedAddr, true}, {lab, ietfProtoAddr, true}, {lab, aliMetaAddr, false},
			{"", sharedAddr, false}, {"", ietfProtoAddr, false},
		} {
			if got := get(t, tc.tok, netip.AddrPortFrom(tc.a, uint16(port))); got != tc.want {
				t.Errorf("%v for token %q: allowed %v, want %v (rule lab-shared names 100.64.0.0/10 and 192.0.0.0/24 for lab)", tc.a, tc.tok, got, tc.want)
			}
		}
	})
	t.Run("IPv6", func(t *testing.T) { checkPolicyIPv6(t, e, get, lab, okPort, denyPort) })
	t.Run("Expose", func(t *testing.T) {
		code, _, stderr := e.runWith(t, runOpts{flags: []string{"--expose", "8080"}}, "true")
		if code != 125 || !strings.Contains(stderr, "[[expose]]") {
			t.Errorf("--expose 8080 for token e2e: exit %d, want 125 naming [[expose]]%s", code, e.diag(stderr))
		}
		code, _, stderr = e.runWith(t, runOpts{token: lab, flags: []string{"--expose", "8080"}}, "true")
		if code != 0 {
			t.Errorf("--expose 8080 for token lab: exit %d, want 0%s", code, e.diag(stderr))
		}
		code, _, stderr = e.runWith(t, runOpts{token: lab, flags: []string{"--expose", "9000"}}, "true")
		if code != 125 {
			t.Errorf("--expose 9000 for token lab (outside 8000-8999): exit %d, want 125%s", code, e.diag(stderr))
		}
	})

	echo := tp.Port()
	p := tp.Start(t, tp.INET, nil, e.peer, "tcpecho", fmt.Sprintf("0.0.0.0:%d", echo))
	tp.WaitTCP(t, tp.INET, inet(echo), p)
	t.Run("TokenLimits", func(t *testing.T) {
		for _, tc := range []struct {
			tok, want string
		}{{lab, "ok=2 failed=1 "}, {"", "ok=3 failed=0 "}} {
			code, out, stderr := e.runWith(t, runOpts{token: tc.tok}, e.peer, "tcpflows", inet(echo).String(), "3", "0s")
			if code != 0 || !strings.HasPrefix(out, tc.want) {
				t.Errorf("3 connections, token %q: exit %d, %q, want %q (lab: max_flows = 2)%s", tc.tok, code, out, tc.want, e.diag(stderr))
			}
		}
	})

	t.Run("Reload", func(t *testing.T) {
		// A job that holds a connection to the echo server across the
		// reloads and checks that it still echoes at the end, while a
		// reloaded policy that denies the echo port is in force: a reload
		// applies to new flows only.
		held := e.start(t, e.peer, "tcpflows", inet(echo).String(), "1", "4s")
		time.Sleep(time.Second)
		reload := func() (int, string, string) {
			return e.admin(t, "gateway", "reload", "--state", e.state)
		}

		// Broken: the old policy stays.
		write(policyConfig(denyPort, "\n[[policy.rule]]\nname = \"bad\"\naction = \"deny\"\nto = [\"10.0.0.1/8\"]\n"))
		code, out, stderr := reload()
		wantLoc := file + ":19: policy.rule[3].to"
		if code == 0 || !strings.Contains(stderr, wantLoc) {
			t.Errorf("reload of a broken file: exit %d, %q %q, want non-zero naming %s", code, out, stderr, wantLoc)
		}
		if !strings.Contains(e.gw.Stderr(), "config reload failed") {
			t.Errorf("gateway did not log the failed reload%s", e.diag(""))
		}
		check := func(a netip.AddrPort) bool {
			code, _, _ := e.run(t, e.peer, "tcpcheck", a.String())
			return code == 0
		}
		if !check(inet(echo)) || get(t, "", inet(denyPort)) {
			t.Errorf("after the broken reload the old policy is not in force")
		}

		// Good: deny the echo port for new flows.
		write(policyConfig(denyPort, fmt.Sprintf("\n[[policy.rule]]\nname = \"no-echo\"\naction = \"deny\"\nproto = \"tcp\"\nports = [%d]\n", echo)))
		code, out, stderr = reload()
		if code != 0 || !strings.Contains(out, "7 policy rules") {
			t.Fatalf("reload: exit %d, %q%s", code, out, e.diag(stderr))
		}
		if check(inet(echo)) {
			t.Errorf("echo port after the reload that denies it: allowed, want refused")
		}
		code, err := held.Wait(60 * time.Second)
		if err != nil || code != 0 || !strings.HasPrefix(held.Stdout(), "ok=1 failed=0 ") || !strings.Contains(held.Stdout(), "alive=1") {
			t.Errorf("job holding a connection across the reloads: exit %d (%v), %q, want its connection alive%s", code, err, held.Stdout(), e.diag(held.Stderr()))
		}
		// SIGHUP: back to the first policy.
		write(policyConfig(denyPort, ""))
		if err := e.gw.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !check(inet(echo)) {
			if time.Now().After(deadline) {
				t.Fatalf("echo port still refused 10 s after SIGHUP%s", e.diag(""))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if ok, c := e.gw.Exited(); ok {
			t.Errorf("gateway exited (%d) during the reloads", c)
		}
	})

	t.Run("BrokenAtStart", func(t *testing.T) {
		bad := filepath.Join(dir, "broken.toml")
		if err := os.WriteFile(bad, []byte("version = 1\n[policy]\ndefault = \"perhaps\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"gateway", "--state", filepath.Join(dir, "state2"), "--config", bad,
			"--listen", netip.AddrPortFrom(tp.DMZAddrCN, gatewayPort+1).String(), "--egress-addr", tp.DMZAddrINET.String()}
		if mode == modeKernel {
			args = append(args, "--egress", "kernel", "--tun", "airlock9")
		}
		code, _, stderr := tp.Run(t, 30*time.Second, tp.DMZ, e.gwUser, e.airlock, args...)
		if want := bad + ":3: policy.default"; code == 0 || !strings.Contains(stderr, want) {
			t.Errorf("gateway with a broken config: exit %d, stderr %q, want a failure naming %s", code, stderr, want)
		}
		if _, err := os.Stat(filepath.Join(dir, "state2")); err == nil {
			t.Error("gateway created its state directory although its config is broken")
		}
	})
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
