// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestKernelEgressPrefix runs a kernel-mode gateway with --egress-prefix
// on a prefix that inet routes to dmz: a job's IPv6 connection leaves from
// its own address in the prefix (the one embedding its IPv4 tunnel
// address) with its own source port, whois finds the job by that address
// alone, its exposed port is its own port at its own address, and other
// ports of that address do not reach it.
func TestKernelEgressPrefix(t *testing.T) {
	prefix := netip.MustParsePrefix("2001:db8:77::/96")
	e := newEnvMode(t, modeKernel, "--egress-prefix", prefix.String())
	// The site routes the prefix to the gateway host.
	if code, _, stderr := e.tp.Run(t, 10*time.Second, e.tp.INET, nil, "ip", "-6", "route", "add", prefix.String(), "via", topology.DMZAddrINET6.String()); code != 0 {
		t.Fatalf("route %v to dmz in inet: %s", prefix, stderr)
	}
	if strings.Contains(e.gw.Stderr(), "egress-prefix") && strings.Contains(e.gw.Stderr(), "level=ERROR") {
		t.Errorf("the gateway reports a setup problem of --egress-prefix that this topology does not have%s", e.diag(""))
	}
	job := "own6"
	port := e.tp.StartTCPSrcPort(t)
	url := fmt.Sprintf("http://[%s]:%d/", topology.INETAddr6, port)
	out := e.mustRunOpts(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + job}}, "sh", "-c",
		"ip -4 -o addr show dev tun0; curl --http0.9 -sS --max-time 10 -w '\\n%{local_ip} %{local_port}\\n' "+url+"; date -u +%s.%N")
	m := regexp.MustCompile(`inet (\S+)/\d+[^\n]*\n\[([0-9a-f:]+)\]:(\d+)\n+(\S+) (\d+)\n(\d+)\.(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("job output %q: want its IPv4 address, what inet saw and its local address and port", out)
	}
	v4, seenAddr, seenPort, localIP, localPort := netip.MustParseAddr(m[1]), netip.MustParseAddr(m[2]), m[3], m[4], m[5]
	sec, _ := strconv.ParseInt(m[6], 10, 64)
	nsec, _ := strconv.ParseInt(m[7], 10, 64)
	at := time.Unix(sec, nsec) // while the job ran
	own := lease.Embed6(prefix, v4)
	if seenAddr != own {
		t.Errorf("inet saw the job (tunnel %v, %s) from %v, want its own address %v", v4, localIP, seenAddr, own)
	}
	if seenPort != localPort {
		t.Errorf("inet saw source port %s, the job used %s: want no port translation", seenPort, localPort)
	}
	// whois by the address alone (any port) and the time.
	if recs := e.whois(t, netip.AddrPortFrom(own, 1), at); len(recs) != 1 || recs[0].JobID != job {
		t.Errorf("whois [%v]:1: %+v, want job %s", own, recs, job)
	}

	// An exposed port: the job's own port at its own address.
	a := e.startWith(t, runOpts{flags: []string{"--expose", "8080", "--expose", "8080/udp"}, env: []string{"AIRLOCK_JOB_ID=own6-expose"}},
		"sh", "-c", "ip -4 -o addr show dev tun0; exec "+e.peer+" jobserve 8080 25 own")
	defer func() {
		a.Signal(syscall.SIGTERM)
		a.Wait(15 * time.Second)
	}()
	if !a.WaitStdout("ready\n", 30*time.Second) {
		t.Fatalf("exposed job not ready: %q%s", a.Stdout(), e.diag(a.Stderr()))
	}
	m = regexp.MustCompile(`inet (\S+)/`).FindStringSubmatch(a.Stdout())
	if m == nil {
		t.Fatalf("exposed job printed no IPv4 address: %q", a.Stdout())
	}
	own = lease.Embed6(prefix, netip.MustParseAddr(m[1]))
	for _, how := range []string{"tcpget", "udpget"} {
		ap := netip.AddrPortFrom(own, 8080)
		if code, out, _ := e.inetGet(t, how, ap); code != 0 || out != "hello from own\n" {
			t.Errorf("%s %v (the job's own port at its own address): exit %d, %q%s", how, ap, code, out, e.diag(a.Stderr()))
		}
	}
	if code, out, d := e.inetGet(t, "tcpget", netip.AddrPortFrom(own, 8081)); code == 0 || d > 5*time.Second {
		t.Errorf("tcp to an unexposed port of the job's own address: exit %d, %q after %v, want a bounded failure", code, out, d)
	}
}

// ownPrefix6 is the routed IPv6 prefix TestIPv6OnlyNode gives jobs their own
// public IPv6 addresses from (--egress-prefix).
var ownPrefix6 = netip.MustParsePrefix("2001:db8:ee::/96")

// checkEgressPrefixUser: a user-mode gateway with --egress-prefix refuses to
// start, naming the fix, until the prefix is a local route; then each
// job's IPv6 connections leave from its own address (embedding its IPv4
// tunnel address) with its own source ports, whois answers by that
// address alone, and an exposed port is the job's own port at its own
// address.
func checkEgressPrefixUser(t *testing.T, e *env, listen string) {
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
	runPingOwnAddress(t, e)
}

// runPingOwnAddress: with --egress-prefix, a job's ping -6 leaves from
// its own address (the ICMPv6 ping socket binds it with IPV6_FREEBIND:
// the address is on no interface, a local route brings its replies) and
// the IPv6-only outside host answers. The gateway user may open ping
// sockets, as a site admin would allow.
func runPingOwnAddress(t *testing.T, e *env) {
	// Ping sockets are opened per echo flow: the running gateway uses the
	// sysctl from now on (its start-up probe only logs).
	mustCmd(t, "ip", "netns", "exec", e.tp.DMZ, "sysctl", "-q", "-w", "net.ipv4.ping_group_range=0 2147483647")
	code, out, stderr := e.runWith(t, runOpts{viaEnv: true}, "ping", "-6", "-n", "-c", "2", "-W", "5", topology.V6HostAddr.String())
	if code != 0 || !strings.Contains(out, "2 received") {
		t.Errorf("ping -6 %s from a job with its own IPv6 address: exit %d, %q, want 2 replies%s", topology.V6HostAddr, code, out, e.diag(stderr))
	}
}
