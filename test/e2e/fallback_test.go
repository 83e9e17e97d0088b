// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/test/topology"
)

// udpEchoPy is a UDP echo client for jobs of the fallback modes: it sends N
// numbered datagrams with sendto() on an unconnected socket (or, with
// "socks", through the SOCKS5 UDP ASSOCIATE of the proxy in ALL_PROXY, as
// a program that honours ALL_PROXY would), checks each echo and its
// source, and prints "ok N SOURCE".
const udpEchoPy = `
import os, socket, struct, sys
from urllib.parse import urlparse
ip, port, n, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
dst, wrap, unwrap = (ip, port), (lambda m: m), (lambda d: (d, None))
if how == "connected":
    s.connect(dst)
    dst = None
    # recvfrom on a connected socket names the peer; under seccomp that is
    # the loopback relay (documented), so the source is not checked.
if how == "socks":
    u = urlparse(os.environ["ALL_PROXY"])
    c = socket.create_connection((u.hostname, u.port), timeout=5)
    user, pw = u.username.encode(), u.password.encode()
    c.sendall(bytes([5, 1, 2]) + bytes([1, len(user)]) + user + bytes([len(pw)]) + pw + bytes([5, 3, 0, 1, 0, 0, 0, 0, 0, 0]))
    r = b""
    while len(r) < 14:
        r += c.recv(14 - len(r))
    assert r[:4] == bytes([5, 2, 1, 0]) and r[5] == 0, r
    dst = (socket.inet_ntoa(r[8:12]), struct.unpack(">H", r[12:14])[0])
    hdr = bytes([0, 0, 0, 1]) + socket.inet_aton(ip) + struct.pack(">H", port)
    wrap = lambda m: hdr + m
    unwrap = lambda d: (d[10:], socket.inet_ntoa(d[4:8]))
ok, src = 0, None
for i in range(n):
    m = ("airlock-udp %d %s" % (i, "x" * (i % 300))).encode()
    for attempt in range(5):
        if dst:
            s.sendto(wrap(m), dst)
        else:
            s.send(m)
        try:
            while True:
                d, a = s.recvfrom(4096)
                d, inner = unwrap(d)
                if d == m:
                    src = "connected" if how == "connected" else (inner or a[0])
                    break
            ok += 1
            break
        except socket.timeout:
            pass
print("ok", ok, src)
`

// TestFallbackModes runs jobs with user namespaces made unavailable to the
// client (airlock-testpeer nouserns: a seccomp filter on the client's
// process tree, nothing changed on the host) in each fallback mode, and
// checks what auto picks with and without user namespaces.
func TestFallbackModes(t *testing.T) {
	v6 := &fallback6{}
	e := newEnvHook(t, modeUser, v6.topology(), v6.hook(t))
	topology.BuildPreload(t) // next to the airlock binary, where airlock run finds it
	iperfPort := e.tp.StartIperf3Server(t)
	dir := topology.TempDir(t)
	py := filepath.Join(dir, "udpecho.py")
	if err := os.WriteFile(py, []byte(udpEchoPy), 0o644); err != nil {
		t.Fatal(err)
	}
	v6.udpEcho = py
	inet := e.tp.INETAddr.String()
	smallURL := fmt.Sprintf("http://%s:%d/small", zoneName, e.httpPort)
	httpAddr := fmt.Sprintf("%s:%d", inet, e.httpPort)

	// run runs airlock run --mode MODE -- ARGS without user namespaces.
	run := func(t *testing.T, mode string, timeout time.Duration, args ...string) (int, string, string) {
		t.Helper()
		argv := e.command(runOpts{flags: []string{"--mode", mode}}, args...)
		return e.tp.Run(t, timeout, e.tp.CN, e.u, e.peer, append([]string{"nouserns"}, argv...)...)
	}
	modeLine := func(stderr string) string {
		for _, l := range strings.Split(stderr, "\n") {
			if strings.HasPrefix(l, "airlock: mode ") {
				return l
			}
		}
		return ""
	}

	t.Run("NetnsDiesWithClient", func(t *testing.T) { e.jobDiesWithClient(t, "netns", nil) })
	t.Run("AutoPicksNetns", func(t *testing.T) {
		code, out, stderr := e.runWith(t, runOpts{flags: []string{"--mode", "auto"}}, "true")
		if code != 0 || !strings.HasPrefix(modeLine(stderr), "airlock: mode netns:") {
			t.Errorf("auto with user namespaces: exit %d, %q, mode line %q, want netns%s", code, out, modeLine(stderr), e.diag(stderr))
		}
	})
	t.Run("AutoFallsBackToSeccomp", func(t *testing.T) {
		code, out, stderr := run(t, "auto", runTimeout, "true")
		// Nothing of this run is left: no process whose command line
		// carries this environment's join token. (Other tests on the
		// machine may run jobs as the same user, so the user's process
		// list as a whole proves nothing.)
		if left := processesWith(e.token); len(left) > 0 {
			t.Errorf("processes left behind by airlock run --mode auto -- true: %v", left)
		}
		l := modeLine(stderr)
		if code != 0 || !strings.HasPrefix(l, "airlock: mode seccomp (netns unavailable: ") || !strings.Contains(l, "not covered: ") {
			t.Errorf("auto without user namespaces: exit %d, %q, mode line %q, want seccomp, why and what is not covered%s", code, out, l, e.diag(stderr))
		}
	})
	t.Run("AutoFallsBackToPreload", func(t *testing.T) {
		// No seccomp either (as a kernel without it): the next best.
		argv := e.command(runOpts{flags: []string{"--mode", "auto"}}, "/usr/bin/python3", "-c",
			"import socket; print(socket.gethostbyname('"+zoneName+"'))")
		code, out, stderr := e.tp.Run(t, runTimeout, e.tp.CN, e.u, e.peer, append([]string{"nouserns", "-noseccomp"}, argv...)...)
		l := modeLine(stderr)
		if code != 0 || strings.TrimSpace(out) != inet || !strings.HasPrefix(l, "airlock: mode preload (netns unavailable: ") ||
			!strings.Contains(l, "; seccomp unavailable: ") {
			t.Errorf("auto without user namespaces and seccomp: exit %d, %q, mode line %q, want preload resolving %s to %s%s", code, out, l, zoneName, inet, e.diag(stderr))
		}
		t.Log(l)
	})
	t.Run("NoLeftovers", func(t *testing.T) {
		// What the job leaves running is stopped with it, as in netns
		// mode: airlock run is their subreaper and kills them by PID.
		for _, mode := range []string{"seccomp", "preload"} {
			code, out, stderr := run(t, mode, runTimeout, "sh", "-c", "sleep 31.4159 & (sleep 31.4159 &) ; echo started")
			if code != 0 || strings.TrimSpace(out) != "started" {
				t.Errorf("--mode %s: exit %d, %q%s", mode, code, out, e.diag(stderr))
			}
			if left := processesWith("31.4159"); len(left) > 0 {
				t.Errorf("--mode %s: processes left behind: %v", mode, left)
			}
		}
	})
	t.Run("StartupLog", func(t *testing.T) {
		// Not an assertion (speed is measured by bench/): what `airlock
		// run --mode M -- true` costs, logged for comparison.
		for _, mode := range []string{"netns", "seccomp", "preload", "proxy"} {
			var ds []time.Duration
			for i := 0; i < 5; i++ {
				start := time.Now()
				code, _, stderr := e.runWith(t, runOpts{flags: []string{"--mode", mode}}, "true")
				if code != 0 {
					t.Fatalf("--mode %s -- true: exit %d%s", mode, code, e.diag(stderr))
				}
				ds = append(ds, time.Since(start))
			}
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			t.Logf("airlock run --mode %s -- true: median %v of 5 (with ip netns exec and setpriv)", mode, ds[2].Round(100*time.Microsecond))
		}
	})
	t.Run("Ping6Netns", func(t *testing.T) { runPing6(t, e) })
	t.Run("ExposeTCPIPv6", func(t *testing.T) { runExposeIPv6(t, e) })
	t.Run("TUN0600", func(t *testing.T) {
		// A node that ships /dev/net/tun 0600 (a node of the device with
		// that mode, in a mount namespace of airlock run's own): --mode
		// netns refuses and says what the admin can do, --mode auto
		// falls back and says why.
		tun := topology.NewTUNNode(t, 0o600)
		for _, tc := range []struct {
			mode string
			code int
			want []string
		}{
			{"netns", 125, []string{"airlock: --mode netns: access /dev/net/tun: permission denied", "/dev/net/tun has mode 0600 on this host",
				"most distributions ship it 0666", "ask the admin to run `chmod 0666 /dev/net/tun`", "CAP_NET_ADMIN", "--mode auto"}},
			{"auto", 0, []string{"airlock: mode seccomp (netns unavailable: access /dev/net/tun: permission denied)"}},
		} {
			argv := tun.Command(e.u, e.command(runOpts{flags: []string{"--mode", tc.mode}}, "true")...)
			code, _, stderr := e.tp.Run(t, runTimeout, e.tp.CN, nil, argv[0], argv[1:]...)
			t.Logf("--mode %s with /dev/net/tun 0600: exit %d, stderr:\n%s", tc.mode, code, stderr)
			if code != tc.code {
				t.Errorf("--mode %s with /dev/net/tun 0600: exit %d, want %d%s", tc.mode, code, tc.code, e.diag(stderr))
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("--mode %s with /dev/net/tun 0600: stderr lacks %q", tc.mode, w)
				}
			}
		}
	})
	t.Run("NetnsRefused", func(t *testing.T) {
		code, _, stderr := run(t, "netns", runTimeout, "true")
		if code != 125 || !strings.Contains(stderr, "user namespace") || !strings.Contains(stderr, "--mode auto") {
			t.Errorf("--mode netns without user namespaces: exit %d, want 125 and a message naming the fix%s", code, e.diag(stderr))
		}
	})

	t.Run("ExposeTCP", func(t *testing.T) {
		// An exposed port reaches a job without a namespace: the client's
		// stack passes the gateway's inbound connections to the port on
		// the node's loopback.
		j := e.startExposed(t, "fallback", "--mode", "seccomp", "--expose", "8080")
		code, out, _ := e.inetGet(t, "tcpget", j.tcp)
		if code != 0 || strings.TrimSpace(out) != "hello from fallback" {
			t.Errorf("tcpget %v from inet: exit %d, %q, want hello from fallback%s", j.tcp, code, out, e.diag(j.p.Stderr()))
		}
		j.p.Kill()
	})

	for _, mode := range []string{"seccomp", "preload", "proxy"} {
		t.Run(mode, func(t *testing.T) {
			// Programs that honour proxy variables would use them in
			// preload mode too; --noproxy makes curl test the interception.
			curl := []string{"curl", "-sS", "--max-time", "30"}
			if mode != "proxy" {
				curl = append(curl, "--noproxy", "'*'")
			}
			t.Run("ExitStatus", func(t *testing.T) {
				for _, tc := range []struct {
					args []string
					want int
				}{
					{[]string{"sh", "-c", "exit 3"}, 3},
					{[]string{"sh", "-c", "kill -9 $$"}, 137},
					{[]string{"/nonexistent/airlock-no-such-command"}, 127},
				} {
					if code, _, stderr := run(t, mode, runTimeout, tc.args...); code != tc.want {
						t.Errorf("%v: exit %d, want %d%s", tc.args, code, tc.want, e.diag(stderr))
					}
				}
			})
			t.Run("SignalForwarded", func(t *testing.T) {
				// SIGTERM to airlock run reaches the job, whose status
				// comes back.
				argv := e.command(runOpts{flags: []string{"--mode", mode}}, "sh", "-c", `trap "exit 42" TERM; echo ready; sleep 30 & wait`)
				p := e.tp.Start(t, e.tp.CN, e.u, e.peer, append([]string{"nouserns"}, argv...)...)
				if !p.WaitStdout("ready", 20*time.Second) {
					t.Fatalf("job did not start: %s", p.Describe())
				}
				if err := p.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if code, err := p.Wait(10 * time.Second); err != nil || code != 42 {
					t.Errorf("after SIGTERM: exit %d (%v), want 42 from the job's trap: %s", code, err, p.Describe())
				}
			})
			t.Run("DiesWithClient", func(t *testing.T) { e.jobDiesWithClient(t, mode, []string{"nouserns"}) })
			t.Run("CurlByName", func(t *testing.T) {
				code, out, stderr := run(t, mode, runTimeout, "bash", "-c", "set -o pipefail; "+strings.Join(curl, " ")+" '"+smallURL+"' | sha256sum")
				if got := strings.Fields(out); code != 0 || len(got) == 0 || got[0] != e.sha["small"] {
					t.Fatalf("curl %s: exit %d, %q, want sha256 %s%s", smallURL, code, out, e.sha["small"], e.diag(stderr))
				}
				l := modeLine(stderr)
				if !strings.HasPrefix(l, "airlock: mode "+mode+" (asked for): ") || !strings.Contains(l, "through the tunnel") {
					t.Errorf("mode line %q", l)
				}
			})
			if mode != "proxy" {
				t.Run("Dig", func(t *testing.T) {
					// dig has its own resolver: its queries to the node's
					// nameserver (unreachable) go to the tunnel's DNS.
					for _, tcp := range []string{"+notcp", "+tcp"} {
						code, out, stderr := run(t, mode, runTimeout, "dig", "+short", "+time=2", "+tries=2", tcp, zoneName)
						if code != 0 || strings.TrimSpace(out) != inet {
							t.Errorf("dig %s %s: exit %d, %q, want %s%s", tcp, zoneName, code, out, inet, e.diag(stderr))
						}
					}
				})
			}
			forFamilies(t, "UDPEcho", func(t *testing.T, f *ipfamily.Family) {
				if f == ipfamily.V6 && mode == "proxy" {
					t.Skip("proxy mode's SOCKS UDP relay to IPv6: internal/proxy TestSOCKSUDPAssociate/IPv6")
				}
				// seccomp catches connect(): the client connects its
				// socket, as its line says it must.
				how := map[string]string{"seccomp": "connected", "preload": "direct", "proxy": "socks"}[mode]
				dst, n := e.inetAddr(f).String(), strconv.Itoa(fallbackUDPCount[f.Index])
				code, out, stderr := run(t, mode, runTimeout, "/usr/bin/python3", py, dst, strconv.Itoa(e.udpPort), n, how)
				want := "ok " + n + " " + dst
				if how == "connected" {
					want = "ok " + n + " connected"
				}
				if code != 0 || strings.TrimSpace(out) != want {
					t.Errorf("udp echo to %s (%s): exit %d, %q, want %q%s", dst, how, code, out, want, e.diag(stderr))
				}
				if mode == "seccomp" {
					// A connected UDP socket (Go's net.Dial) is caught too.
					ap := netip.AddrPortFrom(e.inetAddr(f), uint16(e.udpPort)).String()
					code, out, stderr := run(t, mode, runTimeout, e.peer, "udpclient", ap, n)
					if code != 0 || strings.TrimSpace(out) != "ok "+n {
						t.Errorf("udpclient %s: exit %d, %q%s", ap, code, out, e.diag(stderr))
					}
				}
			})
			for _, streams := range []int{1, 10} {
				t.Run(fmt.Sprintf("Iperf3P%d", streams), func(t *testing.T) {
					args := []string{"iperf3", "-c", inet, "-p", strconv.Itoa(iperfPort), "-t", "3", "-P", strconv.Itoa(streams), "--json", "--connect-timeout", "5000"}
					code, out, stderr := run(t, mode, 40*time.Second, args...)
					if mode == "proxy" {
						// iperf3 does not honour proxy variables: proxy
						// mode does not carry it, as its line says.
						var r iperfResult
						if json.Unmarshal([]byte(out), &r) == nil && r.Error == "" && r.End.SumReceived.Bytes > 0 {
							t.Errorf("iperf3 reached the server in proxy mode, which intercepts nothing: exit %d", code)
						}
						return
					}
					bps := parseIperf(t, mode, code, out, stderr, e.diag(stderr))
					t.Logf("%s, %d streams: %.2f Gbit/s", mode, streams, bps/1e9)
				})
			}
			t.Run("StaticBinary", func(t *testing.T) {
				// airlock-testpeer is a static Go binary (CGO_ENABLED=0).
				code, out, stderr := run(t, mode, runTimeout, e.peer, "tcpcheck", httpAddr)
				switch mode {
				case "seccomp":
					if code != 0 {
						t.Errorf("static binary under seccomp: exit %d, %q, want connected%s", code, out, e.diag(stderr))
					}
				default:
					if code == 0 {
						t.Errorf("static binary under %s connected; the mode does not intercept it", mode)
					}
					if !strings.Contains(modeLine(stderr), "statically linked programs") && mode == "preload" {
						t.Errorf("preload mode line %q does not say static binaries are not covered", modeLine(stderr))
					}
				}
			})
			if mode == "proxy" {
				t.Run("Bulk100MiB", func(t *testing.T) {
					// What proxy mode carries, it carries in bulk: the HTTP
					// proxy (http_proxy) and the SOCKS5 proxy (ALL_PROXY,
					// remote DNS), 100 MiB each.
					bigURL := fmt.Sprintf("http://%s:%d/big", zoneName, e.httpPort)
					for _, via := range []string{"", `--proxy "$ALL_PROXY"`} {
						start := time.Now()
						code, out, stderr := run(t, mode, runTimeout, "bash", "-c", "set -o pipefail; curl -sS --max-time 60 "+via+" '"+bigURL+"' | sha256sum")
						if got := strings.Fields(out); code != 0 || len(got) == 0 || got[0] != e.sha["big"] {
							t.Errorf("curl %s %s: exit %d, %q, want sha256 %s%s", via, bigURL, code, out, e.sha["big"], e.diag(stderr))
							continue
						}
						name := map[string]string{"": "http proxy", `--proxy "$ALL_PROXY"`: "socks5h proxy"}[via]
						t.Logf("100 MiB through the %s in %v (including join and exit)", name, time.Since(start).Round(time.Millisecond))
					}
				})
			}
			if mode == "preload" {
				t.Run("ShellChildren", func(t *testing.T) {
					script := strings.Join(curl, " ") + " '" + smallURL + "' | sha256sum; /usr/bin/python3 " + py + " " + inet + " " + strconv.Itoa(e.udpPort) + " 20 direct"
					code, out, stderr := run(t, mode, runTimeout, "sh", "-c", script)
					if code != 0 || !strings.Contains(out, e.sha["small"]) || !strings.Contains(out, "ok 20 "+inet) {
						t.Errorf("sh -c with children under preload: exit %d, %q%s", code, out, e.diag(stderr))
					}
				})
			}
			t.Run("IPv6", func(t *testing.T) { runFallbackIPv6(t, e, v6, mode, run) })
		})
	}
}

// processesWith lists the processes whose command line contains s, after
// giving exiting ones a moment (2 s).
func processesWith(s string) []string {
	var found []string
	topology.Poll(2*time.Second, func() bool {
		found = found[:0]
		dirs, _ := os.ReadDir("/proc")
		for _, d := range dirs {
			if _, err := strconv.Atoi(d.Name()); err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
			if err == nil && strings.Contains(string(b), s) {
				found = append(found, d.Name()+" "+strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		return len(found) == 0
	})
	return found
}

// jobDiesWithClient checks that a job never outlives airlock run: airlock
// run --mode MODE (under the test peer's subcommand pre, if any) is killed
// with SIGKILL, which it cannot forward, while its job sleeps; the job must
// be gone by the time airlock run's death is complete (its parent-death
// signal goes out as airlock run exits), give or take its own exit.
func (e *env) jobDiesWithClient(t *testing.T, mode string, pre []string) {
	argv := e.command(runOpts{flags: []string{"--mode", mode}}, "sh", "-c", `echo "job pid $$"; exec sleep 60`)
	var p *topology.Process
	if pre != nil {
		p = e.tp.Start(t, e.tp.CN, e.u, e.peer, append(pre, argv...)...)
	} else {
		p = e.tp.Start(t, e.tp.CN, e.u, argv[0], argv[1:]...)
	}
	// In netns mode the job's own PID is another namespace's; the host's
	// is the sleep whose parent is airlock run.
	var job int
	topology.Poll(20*time.Second, func() bool {
		if ok, _ := p.Exited(); ok {
			return true
		}
		for _, pid := range childrenOf(p.Cmd.Process.Pid) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
				job = pid
			}
		}
		return job != 0
	})
	if job == 0 {
		t.Fatalf("job did not start: %s", p.Describe())
	}
	killed := time.Now()
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(60 * time.Second); err != nil {
		t.Fatalf("airlock run not reaped 60 s after SIGKILL: %v", err)
	}
	dead := time.Since(killed)
	if !topology.Poll(10*time.Second, func() bool { return processGone(job) }) {
		t.Fatalf("--mode %s: job %d alive %v after airlock run was reaped (%v after its SIGKILL)",
			mode, job, time.Since(killed)-dead, dead)
	}
	t.Logf("--mode %s: airlock run reaped %v after SIGKILL, its job gone %v after SIGKILL", mode,
		dead.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
}

// childrenOf lists the PIDs whose parent is ppid.
func childrenOf(ppid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/stat")
		// PID (COMM) STATE PPID ...: COMM may hold spaces and parentheses.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 {
			if f := strings.Fields(string(b)[i+1:]); len(f) > 1 && f[1] == strconv.Itoa(ppid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// processGone reports whether pid has exited (is gone or a zombie).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// fallbackUDPCount is how many datagrams UDPEcho sends per family.
var fallbackUDPCount = [ipfamily.N]int{200, 50}

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

// runFallbackIPv6 runs the IPv6 subtests of one fallback mode that IPv4 has no twin of (UDPEcho runs per family) (seccomp,
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
