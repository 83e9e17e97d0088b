// SPDX-License-Identifier: MIT

package e2e

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// checkIPv6Kernel runs the kernel-mode IPv6 checks that the shared IPv6
// subtests (checkIPv6, which run in every mode) do not: ping6 through the
// host's forwarding, a packet too big from the gateway reaching the job
// (path MTU discovery), and the floor's refusal of IPv4-embedding
// addresses (NAT64, 6to4 and Teredo images of the floor and of protected
// ranges) and of unique-local ones at once, with a reset.
func checkIPv6Kernel(t *testing.T, e *env) {
	t.Run("Ping6", func(t *testing.T) {
		// inet, and the gateway's IPv6 tunnel address (the job's second
		// nameserver), which the gateway host answers itself.
		out := e.mustRun(t, "sh", "-c", "ping -6 -c 2 -i 0.2 -W 2 "+topology.INETAddr6.String()+" && "+
			"ping -6 -c 1 -W 2 $(awk '/^nameserver .*:/ {print $2; exit}' /etc/resolv.conf)")
		if n := strings.Count(out, " 0% packet loss"); n != 2 {
			t.Errorf("ping -6 to inet and to the gateway's IPv6 tunnel address: %q", out)
		}
	})

	t.Run("PacketTooBig", func(t *testing.T) {
		// dmz's side of its link to inet narrowed to the IPv6 minimum:
		// the gateway answers a larger packet from a job with packet too
		// big, which the job's kernel takes as its path MTU. (A packet
		// too big from a router beyond the gateway, through the NAT:
		// internal/forward/kernel TestIPv6Traffic.)
		_, mtu, _ := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "cat", "/sys/class/net/"+topology.IfDMZToINET+"/mtu")
		if code, _, stderr := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "ip", "link", "set", topology.IfDMZToINET, "mtu", "1280"); code != 0 {
			t.Fatalf("mtu 1280 on %s: %s", topology.IfDMZToINET, stderr)
		}
		t.Cleanup(func() {
			e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "ip", "link", "set", topology.IfDMZToINET, "mtu", strings.TrimSpace(mtu))
		})
		a := topology.INETAddr6.String()
		code, out, stderr := e.run(t, "sh", "-c", "ping -6 -c 3 -i 0.3 -W 1 -M do -s 1300 "+a+"; ip -6 route get "+a+"; ping -6 -c 1 -W 2 -M do -s 1200 "+a)
		if !regexp.MustCompile(`mtu 1280`).MatchString(out) {
			t.Errorf("after a 1348-byte ping over a 1280 link, the job's route to %s has no mtu 1280 (exit %d): %q%s", a, code, out, e.diag(stderr))
		}
		if !strings.Contains(out, "1 received") {
			t.Errorf("a ping that fits the path MTU got no answer: %q", out)
		}
	})

	t.Run("FloorEmbedded", func(t *testing.T) {
		// Each refused at once with a reset (curl: 7, could not connect),
		// not by a timeout.
		for _, dst := range []string{
			"[64:ff9b::7f00:1]:80",    // NAT64 of loopback: floor
			"[2002:6440:2::1]:80",     // 6to4 of the tunnel subnet: floor
			"[fd00:dead::1]:80",       // unique-local: builtin-private
			"[64:ff9b::a9fe:a9fe]:80", // NAT64 of the metadata endpoint
			"[2001:0:a00:1::1]:80",    // Teredo, server in 10/8: builtin-private
		} {
			start := time.Now()
			code, _, stderr := e.run(t, "curl", "-sS", "--max-time", "5", "http://"+dst+"/")
			if d := time.Since(start); code != 7 || d > 4*time.Second {
				t.Errorf("curl %s: exit %d after %v, want 7 (refused) at once%s", dst, code, d.Round(time.Millisecond), e.diag(stderr))
			}
		}
	})
}
