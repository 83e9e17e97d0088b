// SPDX-License-Identifier: MIT

package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestEgressPool runs a gateway whose --egress-addr is a pool of two of
// dmz's outside addresses, in user and kernel mode: two jobs that run at
// the same time leave from different addresses (consecutive blocks
// alternate them), every connection comes from its job's address and
// block, and whois with the (address, port) seen outside names the job.
// A job asking for 1,024 ports gets them as one range of one address, and
// one asking for more than the limit is refused (checkJobPorts).
func TestEgressPool(t *testing.T) {
	for _, mode := range []string{modeUser, modeKernel} {
		t.Run(mode, func(t *testing.T) {
			var pool []netip.Addr
			e := newEnvHook(t, mode, nil, func(e *env) []string {
				pool = e.tp.AddDMZAddrs(t, 2)
				return []string{"--egress-addr", pool[0].String() + "," + pool[1].String()}
			})
			port := e.tp.StartTCPSrcPort(t)
			srv := netip.AddrPortFrom(e.tp.INETAddr, uint16(port)).String()
			jobs := []string{"pool-a", "pool-b"}
			var procs []*topology.Process
			for _, id := range jobs {
				procs = append(procs, e.startWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + id}},
					"sh", "-c", e.peer+" tcpsrcclient "+srv+" 3 && sleep 1"))
				time.Sleep(300 * time.Millisecond) // join in order: a gets block 0, b block 1
			}
			used := map[netip.Addr]string{}
			var during time.Time
			for i, p := range procs {
				code, err := p.Wait(runTimeout)
				if err != nil || code != 0 {
					t.Fatalf("job %s: exit %d (%v), stdout %q%s", jobs[i], code, err, p.Stdout(), e.diag(p.Stderr()))
				}
				if during.IsZero() {
					during = time.Now().Add(-500 * time.Millisecond)
				}
				for _, l := range strings.Fields(p.Stdout()) {
					ap, err := netip.ParseAddrPort(l)
					if err != nil {
						t.Fatalf("job %s: bad answer %q", jobs[i], l)
					}
					if ap.Addr() != pool[0] && ap.Addr() != pool[1] {
						t.Errorf("job %s: connection from %v, want one of the pool %v", jobs[i], ap.Addr(), pool)
					}
					if other, ok := used[ap.Addr()]; ok && other != jobs[i] {
						t.Errorf("jobs %s and %s both left from %v; want one address each", other, jobs[i], ap.Addr())
					}
					used[ap.Addr()] = jobs[i]
					if recs := e.whois(t, ap, during); len(recs) != 1 || recs[0].JobID != jobs[i] || recs[0].Egress[0].Addr != ap.Addr() {
						t.Errorf("whois %v: got %+v, want exactly job %s at %v", ap, recs, jobs[i], ap.Addr())
					}
				}
			}
			if len(used) != 2 {
				t.Errorf("addresses used: %v, want both pool addresses", used)
			}
			if !strings.Contains(e.gw.Stderr(), "pool=2") {
				t.Errorf("gateway start-up log lacks pool=2%s", e.diag(""))
			}
			// Per-job block size on a pool: a run of blocks stays on one
			// address (blocksize_test.go).
			checkJobPorts(t, e, pool)
		})
	}
}

// TestEgressPortsOutsideRange: a user-mode gateway whose --egress-ports
// lie outside dmz's net.ipv4.ip_local_port_range (where the kernel would
// ignore a socket's IP_LOCAL_PORT_RANGE) starts, says that it binds
// explicitly, and two jobs' connections still leave from their own blocks
// (whois maps every port seen outside to its job).
func TestEgressPortsOutsideRange(t *testing.T) {
	e := newEnvMode(t, modeUser, "--egress-ports", "2000-2511", "--block-size", "256")
	if !strings.Contains(e.gw.Stderr(), "lies outside this host's ephemeral range") {
		t.Errorf("gateway log lacks the explicit-binding warning%s", e.diag(""))
	}
	seen, _ := checkPortBlocks(t, e)
	for p := range seen {
		if p < 2000 || p > 2511 {
			t.Errorf("source port %d outside --egress-ports 2000-2511", p)
		}
	}
}
