// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// Names of the env's DNS zone beside zoneName (IPv4 only): one with both
// families, one with inet's IPv6 address only.
const (
	zoneDual = "dual.airlock.test"
	zoneV6   = "v6only.airlock.test"
)

// envZone is the env's DNS zone.
func envZone(tp *topology.Topology) map[string][]netip.Addr {
	return map[string][]netip.Addr{
		zoneName + ".": {tp.INETAddr},
		zoneDual + ".": {tp.INETAddr, topology.INETAddr6},
		zoneV6 + ".":   {topology.INETAddr6},
	}
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

// checkIPv6 runs the shared env's IPv6 subtests: a dual-stack job's
// network, downloads by name (dual-stack names use IPv6 first), UDP, DNS
// (AAAA, the IPv6 resolver), the floor, port blocks and whois over IPv6,
// and exposure on the gateway's IPv6 address. It returns the job's IPv6
// prefix (invalid if it has none).
func checkIPv6(t *testing.T, e *env) netip.Prefix {
	j := jobIPv6(t, e)
	inet6 := topology.INETAddr6

	t.Run("HTTPByNameDualStack", func(t *testing.T) {
		url := fmt.Sprintf("http://%s:%d/small", zoneDual, e.httpPort)
		out := e.mustRun(t, "bash", "-c", "set -o pipefail; curl -sS --max-time 30 "+url+" | sha256sum")
		if got := strings.Fields(out); len(got) == 0 || got[0] != e.sha["small"] {
			t.Fatalf("sha256 of %s = %q, want %s", url, out, e.sha["small"])
		}
		// getaddrinfo puts IPv6 first (the job's gai.conf), and curl,
		// given a head start long enough for a loaded machine, connects
		// over it (its default 200 ms race may go to IPv4 under load).
		if out := e.mustRun(t, "getent", "ahosts", zoneDual); !strings.HasPrefix(out, inet6.String()+" ") {
			t.Errorf("getent ahosts %s = %q, want %v first", zoneDual, out, inet6)
		}
		code, out, stderr := e.run(t, "curl", "-sS", "--max-time", "30", "--happy-eyeballs-timeout-ms", "5000", "-o", "/dev/null", "-w", "%{remote_ip}", url)
		if code != 0 || strings.TrimSpace(out) != inet6.String() {
			t.Errorf("curl %s: exit %d, remote ip %q, want %v (IPv6 first)%s", url, code, out, inet6, e.diag(stderr))
		}
	})

	t.Run("HTTPByNameIPv6Only100MiB", func(t *testing.T) {
		url := fmt.Sprintf("http://%s:%d/big", zoneV6, e.httpPort)
		start := time.Now()
		out := e.mustRun(t, "bash", "-c", "set -o pipefail; curl -sS --max-time 60 "+url+" | sha256sum")
		d := time.Since(start)
		if got := strings.Fields(out); len(got) == 0 || got[0] != e.sha["big"] {
			t.Fatalf("sha256 of %s = %q, want %s", url, out, e.sha["big"])
		}
		t.Logf("100 MiB by name over IPv6 in %v (%.0f Mbit/s including join)", d.Round(time.Millisecond), float64(bigSize)*8/d.Seconds()/1e6)
	})

	t.Run("Iperf3BothWays", func(t *testing.T) {
		port := e.tp.StartIperf3Server(t)
		for _, reverse := range []bool{false, true} {
			args := []string{"iperf3", "-6", "-c", inet6.String(), "-p", strconv.Itoa(port), "-t", "1", "--json", "--connect-timeout", "5000"}
			if reverse {
				args = append(args, "-R")
			}
			code, out, stderr := e.run(t, args...)
			bps := parseIperf(t, fmt.Sprintf("reverse=%v", reverse), code, out, stderr, e.diag(stderr))
			t.Logf("%s mode: iperf3 -6 -t 1 reverse=%v: %.0f Mbit/s", e.mode, reverse, bps/1e6)
		}
	})

	t.Run("UDPEcho", func(t *testing.T) {
		ap := netip.AddrPortFrom(inet6, uint16(e.udpPort)).String()
		code, out, stderr := e.run(t, e.peer, "udpclient", ap, "300")
		if code != 0 || strings.TrimSpace(out) != "ok 300" {
			t.Fatalf("udpclient %s 300: exit %d, %q%s%s", ap, code, out, e.diag(stderr), e.netState(t))
		}
	})

	t.Run("DNS", func(t *testing.T) {
		if out := e.mustRun(t, "dig", "+short", "+time=2", "+tries=2", "AAAA", zoneDual); strings.TrimSpace(out) != inet6.String() {
			t.Errorf("dig AAAA %s = %q, want %s", zoneDual, out, inet6)
		}
		// The gateway's IPv6 tunnel address answers too, UDP and TCP.
		for _, tcp := range []string{"+notcp", "+tcp"} {
			if out := e.mustRun(t, "dig", "@"+j.gw.Addr().String(), tcp, "+short", "+time=2", "+tries=2", zoneName); strings.TrimSpace(out) != e.tp.INETAddr.String() {
				t.Errorf("dig @%s %s %s = %q, want %s", j.gw.Addr(), tcp, zoneName, out, e.tp.INETAddr)
			}
		}
		if out := e.mustRun(t, "getent", "ahosts", zoneV6); !strings.HasPrefix(out, inet6.String()+" ") {
			t.Errorf("getent ahosts %s = %q, want %s", zoneV6, out, inet6)
		}
	})

	t.Run("Floor", func(t *testing.T) {
		// The gateway host's own IPv6 addresses, another tunnel address,
		// unique-local and link-local destinations: refused at connect.
		for _, dst := range []netip.AddrPort{
			netip.AddrPortFrom(topology.DMZAddrCN6, gatewayPort),
			netip.AddrPortFrom(topology.DMZAddrINET6, gatewayPort),
			netip.AddrPortFrom(j.addr.Addr().Next(), 80),
			netip.AddrPortFrom(netip.MustParseAddr("fd00::1"), 80),
			netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), 80),
		} {
			if code, out, _ := e.run(t, e.peer, "tcpcheck", dst.String()); code == 0 {
				t.Errorf("job reached %v over IPv6: %q", dst, out)
			}
		}
	})

	t.Run("PortBlocksAndWhois", func(t *testing.T) {
		port := e.tp.StartTCPSrcPort(t)
		srv := netip.AddrPortFrom(inet6, uint16(port)).String()
		const job = "e2e-ipv6-block"
		p := e.startWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + job}}, "sh", "-c", e.peer+" tcpsrcclient "+srv+" 3 && sleep 1")
		code, err := p.Wait(runTimeout)
		if err != nil || code != 0 {
			t.Fatalf("job: exit %d (%v), stdout %q%s", code, err, p.Stdout(), e.diag(p.Stderr()))
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
			recs := e.whois(t, ap, during)
			if len(recs) != 1 || recs[0].JobID != job {
				t.Errorf("whois %v: got %+v, want exactly job %s", ap, recs, job)
				continue
			}
			if a, _ := attributionAt(recs, ap.Addr()); a.Addr != ap.Addr() || ap.Port() < a.PortLo || ap.Port() > a.PortHi {
				t.Errorf("port %d outside the job's block %+v", ap.Port(), a)
			}
			if len(recs[0].TunnelAddrs) != 2 || !j.addr.Masked().Contains(recs[0].TunnelAddrs[1]) {
				t.Errorf("whois record's tunnel addresses %v, want an IPv6 one of %v", recs[0].TunnelAddrs, j.addr.Masked())
			}
		}
	})

	t.Run("Flows", func(t *testing.T) {
		const job = "e2e-ipv6-flows"
		url := fmt.Sprintf("http://[%s]:%d/small", inet6, e.httpPort)
		if code, _, stderr := e.runWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + job}}, "curl", "-sS", "--max-time", "30", "-o", "/dev/null", url); code != 0 {
			t.Fatalf("curl %s: exit %d%s", url, code, e.diag(stderr))
		}
		dst := netip.AddrPortFrom(inet6, uint16(e.httpPort)).String()
		deadline := time.Now().Add(10 * time.Second)
		for {
			for _, r := range e.flows(t, job).Recent {
				if r.Dst == dst && r.JobID == job {
					if r.BytesIn < smallSize {
						t.Errorf("flow to %s: %d bytes in, want at least %d", dst, r.BytesIn, smallSize)
					}
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no flow record of job %s to %s%s", job, dst, e.diag(""))
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("Expose", func(t *testing.T) {
		x := e.startExposed(t, "v6", "--expose", "8080")
		defer x.p.Kill()
		ap := netip.AddrPortFrom(topology.DMZAddrINET6, x.tcp.Port())
		code, out, _ := e.inetGet(t, "tcpget", ap)
		if code != 0 || !strings.Contains(out, "hello from v6") {
			t.Errorf("tcpget %v (the exposed port on the gateway's IPv6 address): exit %d, %q%s", ap, code, out, e.diag(""))
		}
		// airlock status names the running job's IPv6 address.
		found := false
		for _, js := range e.status(t).Jobs {
			if js.JobID == "expose-v6" {
				found = true
				if len(js.Addrs) != 2 || !j.addr.Masked().Contains(js.Addrs[1]) {
					t.Errorf("airlock status: job expose-v6 has addresses %v, want an IPv6 one of %v", js.Addrs, j.addr.Masked())
				}
			}
		}
		if !found {
			t.Error("airlock status does not list job expose-v6")
		}
	})
	return j.addr
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
				t.Run("Fallback", func(t *testing.T) { runIPv6OnlyNodeFallback(t, e, port4, port6, sha["small"]) }) // fallback6_test.go
			}
			// WireGuard ran over UDP on IPv6, not the TCP fallback.
			if strings.Contains(e.gw.Stderr(), "job uses the TCP transport") {
				t.Errorf("a job fell back to the TCP transport: WireGuard over UDP/IPv6 failed%s", e.diag(""))
			}
		})
	}
	t.Run("EgressPrefix6", func(t *testing.T) { checkEgressPrefix6(t, e, listen) })
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

// ownPrefix6 is the routed prefix TestIPv6OnlyNode gives jobs their own
// public IPv6 addresses from (--egress-prefix).
var ownPrefix6 = netip.MustParsePrefix("2001:db8:ee::/96")

// checkEgressPrefix6: a user-mode gateway with --egress-prefix refuses to
// start, naming the fix, until the prefix is a local route; then each
// job's IPv6 connections leave from its own address (embedding its IPv4
// tunnel address) with its own source ports, whois answers by that
// address alone, and an exposed port is the job's own port at its own
// address.
func checkEgressPrefix6(t *testing.T, e *env, listen string) {
	tp := e.tp
	args := []string{"gateway", "--state", e.state, "--listen", listen, "--egress-prefix", ownPrefix6.String(), "--expose-ports", "8080"}
	code, _, stderr := tp.Run(t, 30*time.Second, tp.DMZ, e.gwUser, e.airlock, args...)
	fix := "ip -6 route add local " + ownPrefix6.String() + " dev lo"
	if code == 0 || !strings.Contains(stderr, fix) {
		t.Errorf("gateway --egress-prefix without the local route: exit %d, want a failure that names %q: %s", code, fix, stderr)
	}
	// airlock gateway --check says the same.
	check := func() (int, string) {
		code, out, stderr := tp.Run(t, 30*time.Second, tp.DMZ, e.gwUser, e.airlock, append(append([]string(nil), args...), "--check")...)
		return code, out + stderr
	}
	if code, out := check(); code == 0 || !strings.Contains(out, fix) {
		t.Errorf("gateway --check --egress-prefix without the local route: exit %d, want 1 naming %q:\n%s", code, fix, out)
	}
	// The admin's one-time setup, and the site's route to the prefix.
	mustCmd(t, "ip", "-n", tp.DMZ, "-6", "route", "add", "local", ownPrefix6.String(), "dev", "lo")
	if code, out := check(); !strings.Contains(out, "is a local route") {
		t.Errorf("gateway --check --egress-prefix with the local route: exit %d, want an ok line for it:\n%s", code, out)
	}
	mustCmd(t, "ip", "-n", tp.INET, "-6", "route", "add", ownPrefix6.String(), "via", topology.DMZAddrINET6.String())
	e.gwArgs = args
	e.startGateway(t)
	if e.token == "" {
		e.token = e.createToken(t, "e2e6")
	}

	port := tp.Port()
	p := tp.Start(t, tp.V6Host, nil, e.peer, "tcpsrcport", fmt.Sprintf("[::]:%d", port))
	tp.WaitTCP(t, tp.V6Host, netip.AddrPortFrom(topology.V6HostAddr, uint16(port)), p)
	const job = "e2e-own6"
	srv := fmt.Sprintf("%s:%d", topology.NameV6, port)
	out := e.mustRunOpts(t, runOpts{viaEnv: true, env: []string{"AIRLOCK_JOB_ID=" + job}}, "sh", "-c",
		"ip -6 -o addr show dev tun0 scope global; "+e.peer+" tcpsrcclient "+srv+" 2 && sleep 1")
	during := time.Now().Add(-500 * time.Millisecond)
	m := regexp.MustCompile(`inet6 (\S+)/`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no IPv6 tunnel address in %q", out)
	}
	tun6 := netip.MustParseAddr(m[1])
	var own netip.AddrPort
	for _, l := range strings.Fields(out) {
		if ap, err := netip.ParseAddrPort(l); err == nil {
			own = ap
			if !ownPrefix6.Contains(ap.Addr()) {
				t.Errorf("connection came from %v, want the job's own address in %v", ap, ownPrefix6)
			}
			b, tb := ap.Addr().As16(), tun6.As16()
			if [4]byte(b[12:]) != [4]byte(tb[12:]) {
				t.Errorf("job's own address %v and its tunnel address %v embed different IPv4 addresses", ap.Addr(), tun6)
			}
		}
	}
	if !own.IsValid() {
		t.Fatalf("tcpsrcclient printed no source address: %q", out)
	}
	code, wout, stderr := e.admin(t, "whois", "--state", e.state, "--json", "--at", during.UTC().Format(time.RFC3339Nano), own.Addr().String())
	if code != 0 || !strings.Contains(wout, `"job_id": "`+job+`"`) {
		t.Errorf("whois %v (address alone): exit %d, %s %s, want job %s", own.Addr(), code, wout, stderr, job)
	}

	// Expose: the job's port 8080 at its own address, port 8080.
	x := e.startExposed(t, "own6", "--expose", "8080")
	defer x.p.Kill()
	recs := e.whois(t, x.tcp, time.Now())
	// The lease's egress entries: its IPv4 block, and its own IPv6
	// address.
	var own6 store.Attribution
	for _, a := range recs[0:min(len(recs), 1)] {
		for _, eg := range a.Egress {
			if eg.Own && eg.Addr.Is6() {
				own6 = eg
			}
		}
	}
	if len(recs) != 1 || !own6.Own || !ownPrefix6.Contains(own6.Addr) {
		t.Fatalf("whois %v: %+v, want one lease with its own IPv6 address in %v", x.tcp, recs, ownPrefix6)
	}
	ap := netip.AddrPortFrom(own6.Addr, 8080)
	code, gout, _ := tp.Run(t, 15*time.Second, tp.V6Host, nil, e.peer, "tcpget", ap.String())
	if code != 0 || !strings.Contains(gout, "hello from own6") {
		t.Errorf("tcpget %v from v6h (the job's own address and port): exit %d, %q%s", ap, code, gout, e.diag(""))
	}
	runPing6OwnAddress(t, e) // fallback6_test.go
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

// checkLimitsIPv6: in every mode a job's IPv6 flows are under its limits:
// the bandwidth limit (iperf3 over IPv6 to iperfPort for 3 s) and the
// flow limit (MaxFlows connections over IPv6, the rest refused at once).
func checkLimitsIPv6(t *testing.T, e *env, limited string, iperfPort int) {
	args := []string{"iperf3", "-6", "-c", topology.INETAddr6.String(), "-p", strconv.Itoa(iperfPort), "-t", "3", "--json", "--connect-timeout", "5000"}
	code, out, stderr := e.runWith(t, runOpts{token: limited}, args...)
	bps := parseIperf(t, "limited job over IPv6", code, out, stderr, e.diag(stderr))
	t.Logf("%s mode: limited job, iperf3 -6 -t 3: %.1f Mbit/s (limit %.0f)", e.mode, bps/1e6, limitRate/1e6)
	// The cap is the property; see TestLimits for the lower bound.
	if bps < 0.5*limitRate || bps > 1.15*limitRate {
		t.Errorf("limited job over IPv6 got %.1f Mbit/s, want at most %.0f (+15%%) and at least half of it", bps/1e6, limitRate/1e6)
	}
	port := e.tp.Port()
	p := e.tp.Start(t, e.tp.INET, nil, e.peer, "tcpecho", fmt.Sprintf("[::]:%d", port))
	srv := netip.AddrPortFrom(topology.INETAddr6, uint16(port))
	e.tp.WaitTCP(t, e.tp.INET, srv, p)
	time.Sleep(time.Second) // refill the new-flow bucket
	const over = 2
	code, out, stderr = e.runWith(t, runOpts{token: limited}, e.peer, "tcpflows", srv.String(), strconv.Itoa(limitMaxFlows+over), "0s")
	var ok, failed int
	if _, err := fmt.Sscanf(out, "ok=%d failed=%d", &ok, &failed); code != 0 || err != nil {
		t.Fatalf("tcpflows over IPv6: exit %d, %q (%v)%s", code, out, err, e.diag(stderr))
	}
	if ok != limitMaxFlows || failed != over {
		t.Errorf("tcpflows over IPv6: ok=%d failed=%d, want ok=%d failed=%d (max %d flows)", ok, failed, limitMaxFlows, over, limitMaxFlows)
	}
}
