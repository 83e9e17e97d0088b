// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// fallback6 is what TestFallbackModes adds for IPv6: the single-stack
// outside hosts, an HTTP server on the IPv6-only one, and a DNS server on
// inet's IPv6 address (the gateway's upstream) that also serves the
// IPv6-only host's name.
type fallback6 struct {
	v6Port  int    // HTTP on topology.V6HostAddr
	udpEcho string // path of udpEchoPy (set by TestFallbackModes)
}

// topology is the option the environment's topology needs.
func (f *fallback6) topology() []topology.Option {
	return []topology.Option{topology.WithSingleStackHosts()}
}

// hook is the environment's gateway hook (newEnvHook): it starts the
// servers and names the DNS server as the gateway's upstream.
func (f *fallback6) hook(t *testing.T) func(e *env) []string {
	return func(e *env) []string {
		f.v6Port, _ = e.tp.StartHTTPIn(t, e.tp.V6Host, topology.V6HostAddr, map[string]int64{"small": smallSize})
		dns := e.tp.StartDNSZone(t, e.tp.INET, topology.INETAddr6, map[string][]netip.Addr{
			zoneName:          {e.tp.INETAddr},
			topology.NameDual: {e.tp.INETAddr, topology.INETAddr6},
			topology.NameV6:   {topology.V6HostAddr},
		})
		return []string{"--dns-upstream", netip.AddrPortFrom(dns, 53).String()}
	}
}

// httpGetPy fetches /small over HTTP/1.0 from a socket of the family
// argv[1] ("4" or "6") connected to (argv[2], argv[3]) and prints
// "status LINE bytes N peerfamily F".
const httpGetPy = `
import socket, sys
fam = socket.AF_INET6 if sys.argv[1] == "6" else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.settimeout(20)
s.connect((sys.argv[2], int(sys.argv[3])))
s.sendall(b"GET /small HTTP/1.0\r\nHost: x\r\n\r\n")
d = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    d += b
head, _, body = d.partition(b"\r\n\r\n")
print("status", head.split(b"\r\n")[0].decode(), "bytes", len(body))
`

// runFallbackIPv6 runs the IPv6 subtests of one fallback mode (seccomp,
// preload or proxy); run runs airlock run --mode mode -- ARGS without user
// namespaces, as in TestFallbackModes. The job's lease is dual-stack (the
// gateway's default).
func runFallbackIPv6(t *testing.T, e *env, f *fallback6, mode string, run func(t *testing.T, mode string, timeout time.Duration, args ...string) (int, string, string)) {
	inet := e.tp.INETAddr.String()
	// Programs that honour proxy variables would use them in preload mode
	// too; --noproxy makes curl test the interception.
	curl := "curl -sS --max-time 30 -g -w ' %{remote_ip}'"
	if mode != "proxy" {
		curl += " --noproxy '*'"
	}
	small := e.sha["small"]
	t.Run("Curl", func(t *testing.T) {
		for _, tc := range []struct{ name, url string }{
			// An IPv6 literal (proxy mode: an absolute URI with one).
			{"literal", fmt.Sprintf("http://[%s]:%d/small", topology.INETAddr6, e.httpPort)},
			// A name with only an AAAA record: the IPv6-only host.
			{"v6-only-name", fmt.Sprintf("http://%s:%d/small", topology.NameV6, f.v6Port)},
			// A dual-stack name.
			{"dual-stack-name", fmt.Sprintf("http://%s:%d/small", topology.NameDual, e.httpPort)},
		} {
			code, out, stderr := run(t, mode, runTimeout, "bash", "-c", "set -o pipefail; "+curl+" '"+tc.url+"' | (head -c "+strconv.Itoa(smallSize)+" | sha256sum; cat)")
			if got := strings.Fields(out); code != 0 || len(got) < 3 || got[0] != small {
				t.Errorf("%s: curl %s: exit %d, %q, want sha256 %s%s", tc.name, tc.url, code, out, small, e.diag(stderr))
				continue
			}
			t.Logf("%s: %s reached from %s", mode, tc.url, strings.Fields(out)[2])
		}
	})
	if mode != "proxy" {
		t.Run("UDPEcho", func(t *testing.T) {
			how := map[string]string{"seccomp": "connected", "preload": "direct"}[mode]
			a6 := topology.INETAddr6.String()
			code, out, stderr := run(t, mode, runTimeout, "/usr/bin/python3", f.udpEcho, a6, strconv.Itoa(e.udpPort), "50", how)
			want := "ok 50 " + a6
			if how == "connected" {
				want = "ok 50 connected"
			}
			if code != 0 || strings.TrimSpace(out) != want {
				t.Errorf("udp echo to [%s]:%d (%s): exit %d, %q, want %q%s", a6, e.udpPort, how, code, out, want, e.diag(stderr))
			}
		})
		t.Run("V4MappedFromIPv6Socket", func(t *testing.T) {
			// A dual-stack program's AF_INET6 socket connecting to an
			// IPv4-mapped address: caught (sockaddr_in6) and carried as
			// IPv4.
			code, out, stderr := run(t, mode, runTimeout, "/usr/bin/python3", "-c", httpGetPy, "6", "::ffff:"+inet, fmt.Sprint(e.httpPort))
			want := fmt.Sprintf(" 200 OK bytes %d", smallSize)
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("AF_INET6 socket to ::ffff:%s: exit %d, %q, want %q%s", inet, code, out, want, e.diag(stderr))
			}
		})
	}
}

// runPing6 pings over IPv6 from a netns job: inet answers (relayed
// through the user-mode gateway's ICMPv6 ping sockets), so does the
// gateway's IPv6 tunnel address (its netstack); the gateway host's own
// address does not (the floor).
func runPing6(t *testing.T, e *env) {
	code, out, stderr := e.runWith(t, runOpts{}, "ping", "-6", "-n", "-c", "2", "-W", "5", topology.INETAddr6.String())
	if code != 0 || !strings.Contains(out, "2 received") || !strings.Contains(out, "from "+topology.INETAddr6.String()) {
		t.Errorf("ping -6 %s from a netns job: exit %d, %q, want 2 replies from it%s", topology.INETAddr6, code, out, e.diag(stderr))
	}
	// The gateway's IPv6 tunnel address (the job's second resolver)
	// answers itself.
	code, out, stderr = e.runWith(t, runOpts{}, "bash", "-c",
		`gw6=$(awk '$1 == "nameserver" && $2 ~ /:/ {print $2; exit}' /etc/resolv.conf); echo "gw6 $gw6"; ping -6 -n -c 1 -W 2 "$gw6"`)
	if code != 0 || !strings.Contains(out, "1 received") {
		t.Errorf("ping -6 to the gateway's IPv6 tunnel address from a netns job: exit %d, %q, want a reply%s", code, out, e.diag(stderr))
	}
	code, out, _ = e.runWith(t, runOpts{}, "ping", "-6", "-n", "-c", "1", "-W", "1", topology.DMZAddrINET6.String())
	if code == 0 || strings.Contains(out, "1 received") {
		t.Errorf("ping -6 %s (the gateway host's own address) from a netns job: exit %d, %q, want no reply", topology.DMZAddrINET6, code, out)
	}
}

// runExposeIPv6: a seccomp-mode job's exposed port is reached over IPv6
// too, at the gateway's IPv6 address (a user-mode gateway carries it to
// the job's IPv4 tunnel address; the client's stack listens on the job's
// IPv6 tunnel address as well, for gateways that send it there).
func runExposeIPv6(t *testing.T, e *env) {
	j := e.startExposed(t, "fallback6", "--mode", "seccomp", "--expose", "8080")
	defer j.p.Kill()
	ap := netip.AddrPortFrom(topology.DMZAddrINET6, j.tcp.Port())
	code, out, _ := e.inetGet(t, "tcpget", ap)
	if code != 0 || strings.TrimSpace(out) != "hello from fallback6" {
		t.Errorf("tcpget %v from inet (the exposed port on the gateway's IPv6 address): exit %d, %q, want hello from fallback6%s", ap, code, out, e.diag(j.p.Stderr()))
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

// runPing6OwnAddress: with --egress-prefix, a job's ping -6 leaves from
// its own address (the ICMPv6 ping socket binds it with IPV6_FREEBIND:
// the address is on no interface, a local route brings its replies) and
// the IPv6-only outside host answers. The gateway user may open ping
// sockets, as a site admin would allow.
func runPing6OwnAddress(t *testing.T, e *env) {
	// Ping sockets are opened per echo flow: the running gateway uses the
	// sysctl from now on (its start-up probe only logs).
	mustCmd(t, "ip", "netns", "exec", e.tp.DMZ, "sysctl", "-q", "-w", "net.ipv4.ping_group_range=0 2147483647")
	code, out, stderr := e.runWith(t, runOpts{viaEnv: true}, "ping", "-6", "-n", "-c", "2", "-W", "5", topology.V6HostAddr.String())
	if code != 0 || !strings.Contains(out, "2 received") {
		t.Errorf("ping -6 %s from a job with its own IPv6 address: exit %d, %q, want 2 replies%s", topology.V6HostAddr, code, out, e.diag(stderr))
	}
}
