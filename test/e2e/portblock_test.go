// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// checkPortBlocks runs two concurrent jobs that each open connections to a
// server in inet recording source ports: every port of a job falls in that
// job's block (as whois reports it), the blocks differ, and whois maps each
// port back to its job. It returns port → job id and a time when both ran.
func checkPortBlocks(t *testing.T, e *env) (map[uint16]string, time.Time) {
	port := e.tp.StartTCPSrcPort(t)
	srv := netip.AddrPortFrom(e.tp.INETAddr, uint16(port)).String()
	jobs := []string{"e2e-block-a", "e2e-block-b"}
	var procs []*topology.Process
	for _, id := range jobs {
		procs = append(procs, e.startWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + id}},
			"sh", "-c", e.peer+" tcpsrcclient "+srv+" 5 && sleep 1"))
	}
	var during time.Time
	seen := map[uint16]string{}
	blocks := map[string][2]uint16{}
	for i, p := range procs {
		code, err := p.Wait(runTimeout)
		if err != nil || code != 0 {
			t.Fatalf("job %s: exit %d (%v), stdout %q%s", jobs[i], code, err, p.Stdout(), e.diag(p.Stderr()))
		}
		if during.IsZero() {
			during = time.Now().Add(-500 * time.Millisecond) // inside both jobs' sleep
		}
		lines := strings.Fields(p.Stdout())
		if len(lines) != 5 {
			t.Fatalf("job %s: %d answers, want 5: %q", jobs[i], len(lines), p.Stdout())
		}
		for _, l := range lines {
			ap, err := netip.ParseAddrPort(l)
			if err != nil {
				t.Fatalf("job %s: bad answer %q", jobs[i], l)
			}
			if ap.Addr() != e.tp.DMZAddrINET {
				t.Errorf("job %s: connection came from %v, want the gateway's public address %v", jobs[i], ap.Addr(), e.tp.DMZAddrINET)
			}
			seen[ap.Port()] = jobs[i]
		}
	}
	for p, job := range seen {
		recs := e.whois(t, netip.AddrPortFrom(e.tp.DMZAddrINET, p), during)
		if len(recs) != 1 || recs[0].JobID != job {
			t.Errorf("whois %v:%d: got %+v, want exactly job %s", e.tp.DMZAddrINET, p, recs, job)
			continue
		}
		a, _ := attributionAt(recs, e.tp.DMZAddrINET)
		b := [2]uint16{a.PortLo, a.PortHi}
		if old, ok := blocks[job]; ok && old != b {
			t.Errorf("job %s used ports of two blocks: %v and %v", job, old, b)
		}
		blocks[job] = b
	}
	if len(blocks) == 2 && blocks[jobs[0]] == blocks[jobs[1]] {
		t.Errorf("both jobs got block %v", blocks[jobs[0]])
	}
	t.Logf("%s mode: blocks %v", e.mode, blocks)
	return seen, during
}

// whois runs airlock whois --json for ap at time at.
func (e *env) whois(t *testing.T, ap netip.AddrPort, at time.Time) []store.LeaseRecord {
	t.Helper()
	code, out, stderr := e.admin(t, "whois", "--state", e.state, "--json", "--at", at.UTC().Format(time.RFC3339Nano), ap.String())
	if code != 0 {
		t.Fatalf("airlock whois %v: exit %d: %s%s", ap, code, out, e.diag(stderr))
	}
	var recs []store.LeaseRecord
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("airlock whois --json: %v: %q", err, out)
	}
	return recs
}

// attributionAt returns where the first of recs was seen at addr (its
// attribution of addr's family).
func attributionAt(recs []store.LeaseRecord, addr netip.Addr) (store.Attribution, bool) {
	if len(recs) == 0 {
		return store.Attribution{}, false
	}
	return recs[0].AttributionAt(addr)
}

// checkRestart restarts the gateway and checks that whois still answers
// for the ports in seen. In kernel mode the gateway is killed with SIGKILL
// while a job runs, which leaves its nftables table behind; the restarted
// gateway must remove it, and after a normal exit no table, TUN or
// ip_forward change may remain.
func checkRestart(t *testing.T, e *env, seen map[uint16]string, at time.Time) {
	if e.mode == modeKernel {
		p := e.start(t, "sh", "-c", "echo ready; sleep 30")
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(p.Stdout(), "ready") {
			if ok, code := p.Exited(); ok || time.Now().After(deadline) {
				t.Fatalf("job not ready (exited %v, %d)%s", ok, code, e.diag(p.Stderr()))
			}
			time.Sleep(20 * time.Millisecond)
		}
		e.gw.Kill()
		if !strings.Contains(e.nft(t, "list", "tables"), "inet airlock") {
			t.Errorf("no table inet airlock after kill -9; the test cannot show its removal")
		}
		p.Kill()
	} else {
		if err := e.gw.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code, err := e.gw.Wait(15 * time.Second); err != nil || code != 0 {
			t.Fatalf("gateway after SIGTERM: exit %d, %v%s", code, err, e.diag(""))
		}
	}
	e.startGateway(t)
	if e.mode == modeKernel {
		if !strings.Contains(e.gw.Stderr(), "left behind") {
			t.Errorf("restarted gateway did not report the stale table:\n%s", e.gw.Stderr())
		}
		// The killed gateway's table is gone; the rules now in the table
		// are those of leases the restart restored (their jobs keep
		// their address and port block), nothing else.
		restored := map[string]bool{}
		for _, m := range regexp.MustCompile(`lease restored.* addrs="?\[([^\]]*)\]`).FindAllStringSubmatch(e.gw.Stderr(), -1) {
			for _, a := range strings.Fields(m[1]) {
				a, _, _ = strings.Cut(a, "/")
				restored[a] = true
			}
		}
		out := e.nft(t, "list", "table", "inet", "airlock")
		for _, m := range regexp.MustCompile(`ip saddr (\S+) .*snat`).FindAllStringSubmatch(out, -1) {
			if !restored[m[1]] {
				t.Errorf("job rules of the killed gateway for %s survived the restart (restored: %v):\n%s", m[1], restored, out)
			}
		}
	}
	for p, job := range seen {
		if recs := e.whois(t, netip.AddrPortFrom(e.tp.DMZAddrINET, p), at); len(recs) != 1 || recs[0].JobID != job {
			t.Errorf("after restart, whois %v:%d: got %+v, want job %s", e.tp.DMZAddrINET, p, recs, job)
		}
	}
	if code, _, stderr := e.run(t, "true"); code != 0 {
		t.Errorf("job after restart: exit %d%s", code, e.diag(stderr))
	}
	if e.mode != modeKernel {
		return
	}
	if err := e.gw.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := e.gw.Wait(15 * time.Second); err != nil || code != 0 {
		t.Errorf("gateway after SIGTERM: exit %d, %v%s", code, err, e.diag(""))
	}
	if out := e.nft(t, "list", "tables"); strings.Contains(out, "airlock") {
		t.Errorf("after a normal exit nftables still has: %s", out)
	}
	if code, out, _ := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "ip", "link", "show", "airlock0"); code == 0 {
		t.Errorf("after a normal exit the TUN remains: %s", out)
	}
	if _, out, _ := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "sysctl", "-n", "net.ipv4.ip_forward"); strings.TrimSpace(out) != "0" {
		t.Errorf("after a normal exit ip_forward = %q, want 0 (restored)", out)
	}
	if _, out, _ := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "sysctl", "-n", "net.ipv6.conf.all.forwarding"); strings.TrimSpace(out) != "0" {
		t.Errorf("after a normal exit net.ipv6.conf.all.forwarding = %q, want 0 (restored)", out)
	}
}

// nft runs nft ARGS in dmz as root.
func (e *env) nft(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed")
	}
	code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "nft", args...)
	if code != 0 {
		return fmt.Sprintf("(nft %s: exit %d: %s)", strings.Join(args, " "), code, stderr)
	}
	return out
}
