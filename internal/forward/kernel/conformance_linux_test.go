// SPDX-License-Identifier: MIT

package kernel

import (
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/forward/forwardtest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestConformance runs the egress backends' conformance suite against
// kernel mode, inside a fresh user and network namespace: it needs no
// root, only unprivileged user namespaces.
func TestConformance(t *testing.T) {
	if !forwardtest.Isolate(t) {
		return
	}
	forwardtest.Run(t, forwardtest.Options{
		IPBytes: true,
		New: func(t *testing.T, env forwardtest.Env) forward.Backend {
			f, err := New(Config{
				Logger:       env.Logger,
				Addrs:        env.Tunnels,
				MTU:          env.MTU,
				Queues:       3, // a multi-queue TUN read by 3 goroutines (internal/mqtun)
				DNSUpstreams: []netip.AddrPort{env.DNS},
				Egress:       env.Egress,
				OwnPrefix:    env.OwnPrefix,
				BlockSize:    env.BlockSize,
				Flows:        env.Flows,
			})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			// conntrack's UDP timeouts are the kernel's UDP idle
			// timeout; both are per network namespace.
			secs := int(env.UDPIdle.Seconds())
			for _, name := range []string{"nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"} {
				if err := forwardtest.WriteSysctl("net/netfilter/"+name, strconv.Itoa(secs)); err != nil {
					f.Close()
					t.Fatal(err)
				}
			}
			return f
		},
	})
}

// TestConformanceUnprivileged runs part of the suite (what needs TUN,
// nftables, tc and conntrack) as the harness's unprivileged test user when
// the tests run as root, as in CI, so that kernel mode's suite keeps
// passing without root.
func TestConformanceUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: TestConformance itself runs unprivileged")
	}
	u := topology.EnsureUser(t)
	forwardtest.RunAs(t, u, "^TestConformance$/^(TCP|Ping|DNS|Floor|Limits|Bandwidth|Exposures|OwnAddress|Accounting)$")
}
