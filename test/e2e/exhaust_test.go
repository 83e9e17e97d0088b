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

// exhaustBlock is the --block-size of TestBlockExhaustion's gateways.
const exhaustBlock = 8

// TestBlockExhaustion runs, in each egress mode, a job that opens more
// concurrent connections to one server in inet than its port block has
// ports, next to a job that stays within its block: the first gets at most
// a block's worth, the second all of its own, and the failures are
// immediate (the job gets a reset), not timeouts, and the gateway logs the
// exhaustion. In kernel mode an nftables connection limit per job and
// destination refuses the flow before SNAT would drop it. The all-gVisor
// user mode dials like user mode; the backends' refusal itself is the
// conformance suite's (internal/forward/forwardtest, testBlockExhausted),
// so here the two modes whose --block-size reaches a different backend.
func TestBlockExhaustion(t *testing.T) {
	for _, mode := range []string{modeUser, modeKernel} {
		t.Run(mode, func(t *testing.T) {
			e := newEnvMode(t, mode, "--block-size", strconv.Itoa(exhaustBlock))
			over := 4
			srv := netip.AddrPortFrom(e.tp.INETAddr, uint16(e.tp.StartTCPSink(t))).String()
			greedy := e.start(t, e.peer, "tcphold", srv, strconv.Itoa(exhaustBlock+over), "4s")
			// The modest job starts while the greedy one holds its block.
			if !greedy.WaitStdout("ok=", 30*time.Second) {
				ok, code := greedy.Exited()
				t.Fatalf("greedy job: exited %v (%d) before reporting: %q%s", ok, code, greedy.Stdout(), e.diag(greedy.Stderr()))
			}
			code, out, stderr := e.run(t, e.peer, "tcphold", srv, "4", "0s")
			if code != 0 || !strings.HasPrefix(out, "ok=4 failed=0 ") {
				t.Errorf("modest job next to an exhausted block: exit %d, %q, want ok=4 failed=0%s", code, out, e.diag(stderr))
			}
			if code, err := greedy.Wait(runTimeout); err != nil || code != 0 {
				t.Fatalf("greedy job: exit %d (%v)%s", code, err, e.diag(greedy.Stderr()))
			}
			var ok, failed int
			var slowest time.Duration
			var ds string
			if _, err := fmt.Sscanf(greedy.Stdout(), "ok=%d failed=%d slowest_failure=%s", &ok, &failed, &ds); err != nil {
				t.Fatalf("greedy job output %q: %v", greedy.Stdout(), err)
			}
			slowest, _ = time.ParseDuration(strings.TrimSpace(ds))
			t.Logf("%s mode, block of %d: greedy job ok=%d failed=%d slowest failure %v", mode, exhaustBlock, ok, failed, slowest)
			if ok > exhaustBlock || failed < over || ok+failed != exhaustBlock+over {
				t.Errorf("greedy job: ok=%d failed=%d, want at most %d ok and at least %d failed", ok, failed, exhaustBlock, over)
			}
			if slowest > 2*time.Second {
				t.Errorf("greedy job: slowest failure took %v, want < 2 s (fail at once, not hang)", slowest)
			}
			if mode == modeKernel {
				checkExhaustionIPv6(t, e, srv)
			}
			// Kernel mode refuses in nftables; the gateway reads the
			// rule's counter every 2 s and logs it.
			if !topology.Poll(8*time.Second, func() bool { return strings.Contains(e.gw.Stderr(), "port block exhausted") }) {
				t.Fatalf("gateway log has no port-block exhaustion line%s", e.diag(""))
			}
		})
	}
}

// checkExhaustionIPv6: in kernel mode a job's IPv6 flows to one
// destination are bounded by its block too (the IPv6 SNAT uses the same
// block; set conns6), and refused at once beyond it.
func checkExhaustionIPv6(t *testing.T, e *env, srv4 string) {
	ap, err := netip.ParseAddrPort(srv4)
	if err != nil {
		t.Fatal(err)
	}
	srv := netip.AddrPortFrom(topology.INETAddr6, ap.Port()).String()
	over := 4
	code, out, stderr := e.run(t, e.peer, "tcphold", srv, strconv.Itoa(exhaustBlock+over), "0s")
	var ok, failed int
	var ds string
	if _, err := fmt.Sscanf(out, "ok=%d failed=%d slowest_failure=%s", &ok, &failed, &ds); code != 0 || err != nil {
		t.Fatalf("IPv6 greedy job: exit %d, %q (%v)%s", code, out, err, e.diag(stderr))
	}
	slowest, _ := time.ParseDuration(strings.TrimSpace(ds))
	t.Logf("kernel mode, IPv6, block of %d: greedy job ok=%d failed=%d slowest failure %v", exhaustBlock, ok, failed, slowest)
	if ok > exhaustBlock || failed < over || slowest > 2*time.Second {
		t.Errorf("IPv6 greedy job: ok=%d failed=%d slowest failure %v, want at most %d ok, at least %d failed, each at once", ok, failed, slowest, exhaustBlock, over)
	}
}
