// SPDX-License-Identifier: MIT

package kernel

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

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
		IPv6:    true,
		New: func(t *testing.T, env forwardtest.Env) forward.Backend {
			routeIPv6(t)
			f, err := New(Config{
				Logger:       env.Logger,
				Addrs:        []netip.Prefix{env.Tunnel, netip.MustParsePrefix("fd00:a10c::1/64")},
				MTU:          env.MTU,
				DNSUpstreams: []netip.AddrPort{env.DNS},
				Egress:       []netip.Addr{env.Egress},
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
	forwardtest.RunAs(t, u, "^TestConformance$/^(TCP|Ping|DNS|Floor|Limits|Bandwidth|Exposures|Accounting)$")
}

// routeIPv6 gives the suite's egress link an IPv6 address and default
// route (nobody answers there), so that jobs' IPv6 flows reach the forward
// chain and only the backend's floor and policy stop them.
func routeIPv6(t *testing.T) {
	t.Helper()
	l, err := netlink.LinkByName(forwardtest.EgressLink)
	if err != nil {
		t.Fatal(err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("2001:db8:e::1"), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatalf("ipv6 address: %v", err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP("2001:db8:e::2")}); err != nil {
		t.Fatalf("ipv6 default route: %v", err)
	}
}
