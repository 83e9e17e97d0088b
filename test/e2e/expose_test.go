// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// exposedJob is a running `airlock run --expose 8080 [--expose 8080/udp]
// -- airlock-testpeer jobserve` and where it says it is reachable.
type exposedJob struct {
	p        *topology.Process
	tcp, udp netip.AddrPort
}

// startExposed starts a job named name that serves "hello from NAME" on
// its port 8080, exposed with flags, and waits until it reports ready.
func (e *env) startExposed(t *testing.T, name string, flags ...string) exposedJob {
	t.Helper()
	p := e.startWith(t, runOpts{flags: flags, env: []string{"AIRLOCK_JOB_ID=expose-" + name}}, e.peer, "jobserve", "8080", "25", name)
	if !p.WaitStdout("ready\n", 30*time.Second) {
		ok, code := p.Exited()
		t.Fatalf("exposed job %s not ready (exited %v, %d): stdout %q%s", name, ok, code, p.Stdout(), e.diag(p.Stderr()))
	}
	j := exposedJob{p: p}
	for _, l := range strings.Split(p.Stdout(), "\n") {
		k, v, _ := strings.Cut(l, "=")
		if v == "" {
			continue
		}
		// The list of the port's mappings, IPv4 (this check's) first.
		v, _, _ = strings.Cut(v, ",")
		ap, err := netip.ParseAddrPort(v)
		if err != nil {
			t.Fatalf("job %s: AIRLOCK_EXPOSED_8080 %q: %v", name, v, err)
		}
		switch k {
		case "tcp":
			j.tcp = ap
		case "udp":
			j.udp = ap
		}
	}
	if !j.tcp.IsValid() {
		t.Fatalf("job %s: no AIRLOCK_EXPOSED_8080 in its environment: %q%s", name, p.Stdout(), e.diag(p.Stderr()))
	}
	if j.tcp.Addr() != e.tp.DMZAddrINET {
		t.Errorf("job %s: exposed at %v, want the gateway's public address %v", name, j.tcp, e.tp.DMZAddrINET)
	}
	want := fmt.Sprintf("airlock: exposed tcp/8080 at %s", j.tcp)
	if !strings.Contains(p.Stderr(), want) {
		t.Errorf("job %s: airlock run's stderr lacks %q: %q", name, want, p.Stderr())
	}
	return j
}

// inetGet runs airlock-testpeer tcpget|udpget ADDR in inet and returns its
// exit code, output and how long it took.
func (e *env) inetGet(t *testing.T, how string, ap netip.AddrPort) (int, string, time.Duration) {
	t.Helper()
	start := time.Now()
	code, out, _ := e.tp.Run(t, 15*time.Second, e.tp.INET, nil, e.peer, how, ap.String())
	return code, out, time.Since(start)
}

// checkExpose: a client in inet reaches a job's exposed TCP and UDP port
// through the announced public port; ports of the job's block that are not
// exposed, and of another job's block, do not reach it; the exposure ends
// with the job.
func checkExpose(t *testing.T, e *env) {
	if code, _, stderr := e.runWith(t, runOpts{flags: []string{"--expose", "8080/sctp"}}, "true"); code == 0 || !strings.Contains(stderr, "sctp") {
		t.Errorf("--expose 8080/sctp: exit %d, want a failure that names the bad protocol: %q", code, stderr)
	}
	// Only the ports the admin named (--expose-ports 8080) can be exposed.
	if code, _, stderr := e.runWith(t, runOpts{flags: []string{"--expose", "9090"}}, "true"); code == 0 || !strings.Contains(stderr, "9090") {
		t.Errorf("--expose 9090 (not allowed by the gateway): exit %d, want a refusal naming the port: %q", code, stderr)
	}
	a := e.startExposed(t, "a", "--expose", "8080", "--expose", "8080/udp")
	b := e.startExposed(t, "b", "--expose", "8080")
	if !a.udp.IsValid() {
		t.Fatalf("job a: no AIRLOCK_EXPOSED_8080_UDP: %q", a.p.Stdout())
	}
	t.Logf("%s mode: job a tcp/8080 at %v, udp/8080 at %v; job b tcp/8080 at %v", e.mode, a.tcp, a.udp, b.tcp)
	if code, out, _ := e.inetGet(t, "tcpget", a.tcp); code != 0 || out != "hello from a\n" {
		t.Errorf("tcp to job a's public port %v: exit %d, %q, want hello from a%s", a.tcp, code, out, e.diag(a.p.Stderr()))
	}
	if code, out, _ := e.inetGet(t, "udpget", a.udp); code != 0 || out != "hello from a\n" {
		t.Errorf("udp to job a's public port %v: exit %d, %q, want hello from a%s", a.udp, code, out, e.diag(a.p.Stderr()))
	}
	if code, out, _ := e.inetGet(t, "tcpget", b.tcp); code != 0 || out != "hello from b\n" {
		t.Errorf("tcp to job b's public port %v: exit %d, %q, want hello from b%s", b.tcp, code, out, e.diag(b.p.Stderr()))
	}
	// The exposure listens only where it is announced, the gateway's
	// outside address: not on its inside address (from cn), nor on its
	// loopback (from dmz itself).
	for _, probe := range []struct {
		ns string
		ap netip.AddrPort
	}{
		{e.tp.CN, netip.AddrPortFrom(e.tp.DMZAddrCN, a.tcp.Port())},
		{e.tp.DMZ, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), a.tcp.Port())},
	} {
		if code, out, _ := e.tp.Run(t, 15*time.Second, probe.ns, nil, e.peer, "tcpget", probe.ap.String()); code == 0 || strings.Contains(out, "hello") {
			t.Errorf("job a's exposure answered at %v (from %s): exit %d, %q; want it only at the announced %v", probe.ap, probe.ns, code, out, a.tcp)
		}
	}
	// whois with the announced outside address and a time names the job.
	if recs := e.whois(t, a.tcp, time.Now()); len(recs) != 1 || recs[0].JobID != "expose-a" || recs[0].Egress[0].Addr != e.tp.DMZAddrINET {
		t.Errorf("whois %v now: got %+v, want exactly job expose-a with public address %v", a.tcp, recs, e.tp.DMZAddrINET)
	}
	// Ports that are not exposed: in b's block (below its exposure) and in
	// a's own block (below its two exposures).
	for _, ap := range []netip.AddrPort{
		netip.AddrPortFrom(b.tcp.Addr(), b.tcp.Port()-1),
		netip.AddrPortFrom(a.tcp.Addr(), a.tcp.Port()-2),
	} {
		code, out, d := e.inetGet(t, "tcpget", ap)
		if code == 0 || strings.Contains(out, "hello") {
			t.Errorf("tcp to unexposed %v: exit %d, %q, want a failure", ap, code, out)
		}
		if d > 5*time.Second {
			t.Errorf("tcp to unexposed %v took %v, want a bounded failure (2 s connect timeout)", ap, d)
		}
	}
	for _, j := range []exposedJob{a, b} {
		if err := j.p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if _, err := j.p.Wait(15 * time.Second); err != nil {
			t.Fatalf("exposed job did not exit after SIGTERM: %v", err)
		}
	}
	if code, out, _ := e.inetGet(t, "tcpget", a.tcp); code == 0 {
		t.Errorf("after job a ended, its public port %v still answers: %q", a.tcp, out)
	}
	if !regexp.MustCompile(`exposed=.*tcp/8080=`).MatchString(e.gw.Stderr()) {
		t.Errorf("gateway log has no exposed=[tcp/8080=...] in the join line%s", e.diag(""))
	}
}
