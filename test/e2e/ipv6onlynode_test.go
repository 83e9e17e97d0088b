// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestIPv6OnlyNode: on a compute node with IPv6 only, airlock run reaches
// the gateway over IPv6 (AIRLOCK_GATEWAY=[2001:db8:100::1]:8443: control,
// WireGuard) and the job reaches an IPv4-only and an IPv6-only outside host
// by name, in both user-mode variants and in kernel mode.
func TestIPv6OnlyNode(t *testing.T) {
	topology.RequireRoot(t)
	e := &env{
		tp:      topology.New(t, topology.WithIPv6OnlyCN(), topology.WithSingleStackHosts()),
		u:       topology.EnsureUser(t),
		mode:    modeUser,
		airlock: topology.BuildAirlock(t),
		peer:    topology.BuildPeer(t),
	}
	e.gwUser = e.u
	files := map[string]int64{"small": smallSize}
	port4, sha := e.tp.StartHTTPIn(t, e.tp.V4Host, topology.V4HostAddr, files)
	port6, _ := e.tp.StartHTTPIn(t, e.tp.V6Host, topology.V6HostAddr, files)
	e.tp.SetResolvConf(e.tp.DMZ, e.tp.StartNames(t, nil))
	if code, out, _ := e.tp.Run(t, 5*time.Second, e.tp.CN, nil, "ip", "-4", "-o", "addr", "show", "scope", "global"); code != 0 || strings.TrimSpace(out) != "" {
		t.Fatalf("cn has IPv4 addresses: %q", out)
	}
	base := topology.TempDir(t)
	if err := os.Chown(base, e.u.UID, e.u.GID); err != nil {
		t.Fatal(err)
	}
	userState := filepath.Join(base, "state")
	listen := netip.AddrPortFrom(topology.DMZAddrCN6, gatewayPort).String()
	tokens := map[string]string{} // by state directory
	for _, mode := range []string{modeUser, modeUserNetstack, modeKernel} {
		t.Run(mode, func(t *testing.T) {
			e.mode, e.gwUser, e.state = mode, e.u, userState
			if mode == modeKernel {
				// Kernel mode runs as root, with a state of its own.
				e.gwUser, e.state = nil, filepath.Join(base, "state-kernel")
				t.Cleanup(func() { e.mode, e.gwUser, e.state, e.token = modeUser, e.u, userState, tokens[userState] })
			}
			e.gwArgs = []string{"gateway", "--state", e.state, "--listen", listen}
			switch mode {
			case modeUserNetstack:
				e.gwArgs = append(e.gwArgs, "--tcp-stack", "netstack")
			case modeKernel:
				e.gwArgs = append(e.gwArgs, "--egress", "kernel")
			}
			e.startGateway(t)
			if e.gateway != listen {
				t.Errorf("join.env AIRLOCK_GATEWAY = %q, want %q", e.gateway, listen)
			}
			if tokens[e.state] == "" {
				tokens[e.state] = e.createToken(t, "e2e6")
			}
			e.token = tokens[e.state]
			for _, tc := range []struct {
				name string
				port int
				want netip.Addr
			}{{topology.NameV4, port4, topology.V4HostAddr}, {topology.NameV6, port6, topology.V6HostAddr}} {
				url := fmt.Sprintf("http://%s:%d/small", tc.name, tc.port)
				out := e.mustRunOpts(t, runOpts{viaEnv: true}, "bash", "-c", "set -e; f=$(mktemp); curl -sS --max-time 30 -o $f -w '%{remote_ip}\\n' "+url+"; sha256sum < $f; rm -f $f")
				got := strings.Fields(out)
				if len(got) < 2 || got[0] != tc.want.String() || got[1] != sha["small"] {
					t.Errorf("curl %s: %q, want remote ip %v and sha256 %s", url, out, tc.want, sha["small"])
				}
			}
			if mode == modeUser {
				t.Run("Fallback", func(t *testing.T) { runIPv6OnlyNodeFallback(t, e, port4, port6, sha["small"]) })
			}
			// WireGuard ran over UDP on IPv6, not the TCP fallback.
			if strings.Contains(e.gw.Stderr(), "job uses the TCP transport") {
				t.Errorf("a job fell back to the TCP transport: WireGuard over UDP/IPv6 failed%s", e.diag(""))
			}
		})
	}
	t.Run("EgressPrefix", func(t *testing.T) { checkEgressPrefixUser(t, e, listen) }) // egressprefix_test.go
	t.Run("IPv6OnlyTunnel", func(t *testing.T) {
		e.mode, e.gwUser, e.state = modeUser, e.u, filepath.Join(base, "state-v6only")
		t.Cleanup(func() { e.state, e.token = userState, tokens[userState] })
		checkIPv6OnlyTunnel(t, e, listen, port6, sha["small"])
	})
}

// checkIPv6OnlyTunnel: a gateway whose --subnet lists an IPv6 prefix alone
// gives jobs an IPv6 tunnel address and no IPv4 one, and their flows leave
// from its IPv6 --egress-addr: on the IPv6-only node, a job reaches the
// IPv6-only host by name, and has no IPv4 address to reach anything with.
func checkIPv6OnlyTunnel(t *testing.T, e *env, listen string, port6 int, sha string) {
	subnet := netip.MustParsePrefix("fd7a:a6::/112")
	e.gwArgs = []string{"gateway", "--state", e.state, "--listen", listen, "--subnet", subnet.String(), "--egress-addr", topology.DMZAddrINET6.String()}
	e.startGateway(t)
	e.token = e.createToken(t, "v6only")
	out := e.mustRunOpts(t, runOpts{viaEnv: true}, "ip", "-o", "addr", "show", "scope", "global")
	if strings.Contains(out, "inet ") || !strings.Contains(out, "inet6 fd7a:a6::") {
		t.Errorf("the job's addresses: %q, want one of %s and no IPv4 one", out, subnet)
	}
	url := fmt.Sprintf("http://%s:%d/small", topology.NameV6, port6)
	out = e.mustRunOpts(t, runOpts{viaEnv: true}, "bash", "-c", "set -e; f=$(mktemp); curl -sS --max-time 30 -o $f -w '%{remote_ip}\\n' "+url+"; sha256sum < $f; rm -f $f")
	if got := strings.Fields(out); len(got) < 2 || got[0] != topology.V6HostAddr.String() || got[1] != sha {
		t.Errorf("curl %s through the IPv6-only tunnel: %q, want remote ip %v and sha256 %s", url, out, topology.V6HostAddr, sha)
	}
}

// runIPv6OnlyNodeFallback: on the IPv6-only compute node of
// TestIPv6OnlyNode, jobs in each fallback mode reach the IPv4-only and the
// IPv6-only outside host by name (port4 and port6: their HTTP servers,
// sha: the sha256 of "small").
func runIPv6OnlyNodeFallback(t *testing.T, e *env, port4, port6 int, sha string) {
	topology.BuildPreload(t)
	for _, mode := range []string{"seccomp", "preload", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			curl := "curl -sS --max-time 30 -o $f"
			if mode != "proxy" {
				curl += " --noproxy '*'"
			}
			for _, tc := range []struct {
				name string
				port int
			}{{topology.NameV4, port4}, {topology.NameV6, port6}} {
				url := fmt.Sprintf("http://%s:%d/small", tc.name, tc.port)
				code, out, stderr := e.runWith(t, runOpts{viaEnv: true, flags: []string{"--mode", mode}}, "bash", "-c", "set -e; f=$(mktemp); "+curl+" "+url+"; sha256sum < $f; rm -f $f")
				if got := strings.Fields(out); code != 0 || len(got) < 1 || got[0] != sha {
					t.Errorf("--mode %s: curl %s: exit %d, %q, want sha256 %s%s", mode, url, code, out, sha, e.diag(stderr))
				}
			}
		})
	}
}
