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
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestKernelEgressPrefix6 runs a kernel-mode gateway with --egress-prefix
// on a prefix that inet routes to dmz: a job's IPv6 connection leaves from
// its own address in the prefix (the one embedding its IPv4 tunnel
// address) with its own source port, whois finds the job by that address
// alone, its exposed port is its own port at its own address, and other
// ports of that address do not reach it.
func TestKernelEgressPrefix6(t *testing.T) {
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
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(a.Stdout(), "ready\n") {
		if ok, _ := a.Exited(); ok || time.Now().After(deadline) {
			t.Fatalf("exposed job not ready: %q%s", a.Stdout(), e.diag(a.Stderr()))
		}
		time.Sleep(20 * time.Millisecond)
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
