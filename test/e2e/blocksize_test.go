// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
)

// checkJobPorts runs a job with airlock run --ports 1024 on e's gateway
// (whose --max-block-size is the default, 1024 ports): the job's
// AIRLOCK_EGRESS_ADDR and AIRLOCK_EGRESS_PORTS name a range of 1,024
// ports on one of addrs, every connection it makes leaves from that
// address and range, and whois of each (address, port) names exactly the
// job with that range. A job asking for 1,025 ports is refused with a
// message naming the limit and the flag that raises it.
func checkJobPorts(t *testing.T, e *env, addrs []netip.Addr) {
	t.Helper()
	port := e.tp.StartTCPSrcPort(t)
	srv := netip.AddrPortFrom(e.tp.INETAddr, uint16(port)).String()
	job := "mover-" + e.mode
	p := e.startWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + job}, flags: []string{"--ports", "1024"}},
		"sh", "-c", `echo "env $AIRLOCK_EGRESS_ADDR $AIRLOCK_EGRESS_PORTS"; `+e.peer+" tcpsrcclient "+srv+" 8 && sleep 1")
	code, err := p.Wait(runTimeout)
	if err != nil || code != 0 {
		t.Fatalf("job --ports 1024: exit %d (%v), stdout %q%s", code, err, p.Stdout(), e.diag(p.Stderr()))
	}
	during := time.Now().Add(-500 * time.Millisecond)
	lines := strings.Split(strings.TrimSpace(p.Stdout()), "\n")
	var envAddr, envPorts string
	if len(lines) != 9 {
		t.Fatalf("job --ports 1024: %d lines, want the env line and 8 answers: %q", len(lines), p.Stdout())
	}
	if _, err := fmt.Sscanf(lines[0], "env %s %s", &envAddr, &envPorts); err != nil {
		t.Fatalf("job's env line %q: %v", lines[0], err)
	}
	pub, err1 := netip.ParseAddr(envAddr)
	r, err2 := portblock.ParseRange(envPorts)
	if err1 != nil || err2 != nil || r.Len() != 1024 {
		t.Fatalf("job's AIRLOCK_EGRESS_ADDR=%q AIRLOCK_EGRESS_PORTS=%q: want an address and a range of 1024 ports", envAddr, envPorts)
	}
	known := false
	for _, a := range addrs {
		known = known || a == pub
	}
	if !known {
		t.Errorf("AIRLOCK_EGRESS_ADDR=%v, want one of %v", pub, addrs)
	}
	var recs []store.LeaseRecord
	for _, l := range lines[1:] {
		ap, err := netip.ParseAddrPort(l)
		if err != nil {
			t.Fatalf("bad answer %q", l)
		}
		if ap.Addr() != pub || !r.Contains(ap.Port()) {
			t.Errorf("connection from %v, want %v with a port in %v", ap, pub, r)
		}
		recs = e.whois(t, ap, during)
		if a, _ := attributionAt(recs, ap.Addr()); len(recs) != 1 || recs[0].JobID != job || a.PortLo != r.Lo || a.PortHi != r.Hi {
			t.Errorf("whois %v: %+v, want exactly job %s with ports %v", ap, recs, job, r)
		}
	}
	t.Logf("%s mode: --ports 1024 got %v:%v; connections from %q", e.mode, pub, r, lines[1:])

	code, out, stderr := e.runWith(t, runOpts{flags: []string{"--ports", "1025"}}, "true")
	if code == 0 || !strings.Contains(stderr, "1025 egress ports") || !strings.Contains(stderr, "limit of 1024 per job (--max-block-size)") {
		t.Errorf("job --ports 1025: exit %d, stdout %q, stderr %q; want a refusal naming the limit of 1024 and --max-block-size", code, out, stderr)
	}
}
