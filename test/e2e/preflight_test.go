// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestPreflight runs airlock run --check and airlock gateway --check on a
// working node and gateway host and on broken ones.
func TestPreflight(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway

	t.Run("RunWorkingNode", func(t *testing.T) {
		code, out, _ := e.tp.Run(t, 30*time.Second, e.tp.CN, e.u, e.airlock, "run", "--check", "--gateway", gw, "--pin", e.pin, "--token", e.token)
		if code != 0 {
			t.Errorf("airlock run --check on a working node: exit %d, want 0\n%s", code, out)
		}
		for _, want := range []string{
			"ok      user namespaces:",
			"ok      gateway " + gw + " TCP:",
			"ok      gateway " + gw + " UDP: joined",
			"0 problems",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("airlock run --check: no line %q\n%s", want, out)
			}
		}
		// The check released its lease.
		if st := e.status(t); len(st.Jobs) != 0 {
			t.Errorf("after airlock run --check: %d leases live, want 0", len(st.Jobs))
		}
	})

	t.Run("RunBrokenNode", func(t *testing.T) {
		// A node where /dev/net/tun is 0600 (in a private mount namespace,
		// so no other test sees it), the open-file limit is tiny and UDP
		// to the gateway is dropped.
		tun := topology.NewTUNNode(t, 0o600)
		nft := func(args ...string) {
			t.Helper()
			if code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.CN, nil, "nft", args...); code != 0 {
				t.Fatalf("nft %v in cn: exit %d %s %s", args, code, out, stderr)
			}
		}
		nft("add table inet preflight")
		defer nft("delete table inet preflight")
		nft("add chain inet preflight out { type filter hook output priority 0 ; }")
		nft(fmt.Sprintf("add rule inet preflight out udp dport %d drop", gatewayPort))
		argv := tun.Command(e.u, "prlimit", "--nofile=64:64", e.airlock, "run", "--check", "--mode", "netns", "--gateway", gw, "--pin", e.pin, "--token", e.token)
		code, out, _ := e.tp.Run(t, 60*time.Second, e.tp.CN, nil, argv[0], argv[1:]...)
		if code != 1 {
			t.Errorf("airlock run --check on a broken node: exit %d, want 1\n%s", code, out)
		}
		for _, re := range []string{
			`(?m)^PROBLEM /dev/net/tun: cannot open it read-write \(mode 0600\).*\n\s+fix: chmod 0666 /dev/net/tun`,
			`(?m)^PROBLEM RLIMIT_NOFILE: soft 64, hard 64`,
			`(?m)^ok      gateway \S+ TCP:`,
			`(?m)^warn    gateway \S+ UDP: joined, but no WireGuard handshake.*\n\s+fix: open UDP ` + strconv.Itoa(gatewayPort),
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("airlock run --check on a broken node: no match for %s\n%s", re, out)
			}
		}
		// A wrong pin is a problem of its own.
		wrong := "sha256:" + strings.Repeat("ab", 32)
		code, out, _ = e.tp.Run(t, 30*time.Second, e.tp.CN, e.u, e.airlock, "run", "--check", "--gateway", gw, "--pin", wrong)
		if code != 1 || !regexp.MustCompile(`(?m)^PROBLEM gateway \S+ pin: .*\n\s+fix: copy AIRLOCK_PIN`).MatchString(out) {
			t.Errorf("airlock run --check with a wrong pin: exit %d, want 1 and a pin problem\n%s", code, out)
		}
	})

	t.Run("GatewayWorkingHost", func(t *testing.T) {
		base := topology.TempDir(t)
		if err := os.Chown(base, e.u.UID, e.u.GID); err != nil {
			t.Fatal(err)
		}
		listen := netip.AddrPortFrom(e.tp.DMZAddrCN, gatewayPort+1).String()
		code, out, stderr := e.tp.Run(t, 30*time.Second, e.tp.DMZ, e.gwUser, e.airlock, "gateway", "--check", "--state", filepath.Join(base, "state"), "--listen", listen)
		if code != 0 {
			t.Errorf("airlock gateway --check on a working host: exit %d, want 0\n%s%s", code, out, stderr)
		}
		for _, want := range []string{"ok      state directory", "ok      listen " + listen, "ok      net.ipv4.ping_group_range", "ok      net.ipv4.ip_local_port_range",
			"ok      control port " + listen, "0 problems"} {
			if !strings.Contains(out, want) {
				t.Errorf("airlock gateway --check: no line %q\n%s", want, out)
			}
		}
		// The control port on the outside address (where jobs' flows
		// leave), or on every interface: a warning (issue 33, item 6).
		for _, l := range []string{netip.AddrPortFrom(e.tp.DMZAddrINET, gatewayPort+1).String(), fmt.Sprintf("0.0.0.0:%d", gatewayPort+1)} {
			_, out, stderr := e.tp.Run(t, 30*time.Second, e.tp.DMZ, e.gwUser, e.airlock, "gateway", "--check", "--state", filepath.Join(base, "state"), "--listen", l)
			if !strings.Contains(out, "warn    control port "+l) || !strings.Contains(out, e.tp.DMZAddrINET.String()) {
				t.Errorf("airlock gateway --check --listen %s: no warning that the control port is reachable outside\n%s%s", l, out, stderr)
			}
		}
		if _, err := os.Stat(filepath.Join(base, "state")); !os.IsNotExist(err) {
			t.Errorf("airlock gateway --check created the state directory (%v); it must change nothing", err)
		}
	})

	t.Run("GatewayBrokenHost", func(t *testing.T) {
		// inet as a gateway host: the listen address is not its own,
		// ping sockets are off (ping_group_range "1 0"), the egress ports
		// lie outside the local port range, the state directory is root's,
		// the config file has a typo.
		state := topology.TempDir(t)
		bad := filepath.Join(topology.TempDir(t), "gateway.toml")
		if err := os.WriteFile(bad, []byte("version = 1\n[policy]\ndefualt = \"deny\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := e.tp.Run(t, 30*time.Second, e.tp.INET, e.u, e.airlock, "gateway", "--check", "--state", state,
			"--listen", e.gateway, "--egress-ports", "1000-2000", "--config", bad)
		if code != 1 {
			t.Errorf("airlock gateway --check on a broken host: exit %d, want 1\n%s%s", code, out, stderr)
		}
		for _, re := range []string{
			`(?m)^PROBLEM state directory \S+: owned by uid 0`,
			`(?m)^PROBLEM listen \S+: TCP: .*assign requested address`,
			`(?m)^warn    net.ipv4.ping_group_range: 1\s+0 excludes group`,
			`(?m)^PROBLEM net.ipv4.ip_local_port_range: egress ports 1000-2000 reach outside`,
			`(?m)^PROBLEM config \S+: \S+gateway.toml:3`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("airlock gateway --check on a broken host: no match for %s\n%s", re, out)
			}
		}
	})
}

// runCmd runs a command on the host (as root) and returns its combined
// output.
func runCmd(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}
