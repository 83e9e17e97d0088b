// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/lease"
)

// checkEgressPrefix6 validates --egress-prefix6: an IPv6 prefix of at
// most /96, so that every IPv4 tunnel address of subnet has its own
// address in it.
func checkEgressPrefix6(p, subnet netip.Prefix) error {
	if err := lease.CheckPrefix6(p); err != nil {
		return fmt.Errorf("--egress-prefix6: %w", err)
	}
	a := p.Addr()
	if a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() {
		return fmt.Errorf("--egress-prefix6 %s: want a routed unicast prefix", p)
	}
	return nil
}

// ownAddr6 returns the job's own public IPv6 address in --egress-prefix6:
// the one that embeds its IPv4 tunnel address, like its IPv6 tunnel
// address.
func (g *gateway) ownAddr6(l lease.Lease) netip.Addr {
	return lease.Embed6(g.v6.own, l.Addr)
}

// checkOwnPrefix6 checks, for user mode, the admin's one-time setup for
// --egress-prefix6 (CheckLocalPrefix6); the gateway does not start
// without it.
func checkOwnPrefix6(log *slog.Logger, p netip.Prefix, probe netip.Addr) error {
	if err := CheckLocalPrefix6(p, probe); err != nil {
		return fmt.Errorf("--egress-prefix6 %s: %w", p, err)
	}
	log.Info("--egress-prefix6: the prefix is a local route; jobs' IPv6 flows leave from their own addresses", "prefix", p)
	return nil
}

// CheckLocalPrefix6 checks that p, a user-mode gateway's --egress-prefix6,
// is a local route of this host (probing its address probe; the zero
// Addr means the prefix's first address): jobs' sockets bind to
// addresses of the prefix that no interface has (IPV6_FREEBIND, no
// privilege needed), and the host accepts the replies the site routes to
// it only through such a route. The error says the fix.
func CheckLocalPrefix6(p netip.Prefix, probe netip.Addr) error {
	if !probe.IsValid() {
		probe = p.Masked().Addr().Next()
	}
	routes, err := netlink.RouteGet(probe.AsSlice())
	if err != nil || len(routes) == 0 || routes[0].Type != unix.RTN_LOCAL {
		return fmt.Errorf("the prefix is not a local route of this host, so replies to jobs' own addresses would not reach them; as root, once: ip -6 route add local %s dev lo (and have the site route %s to this host)", p.Masked(), p.Masked())
	}
	return nil
}

// IPv6EgressSource returns the address a user-mode gateway's jobs' IPv6
// flows leave from without --egress-addr6: the source the host picks for
// an outside IPv6 destination.
func IPv6EgressSource() (netip.Addr, error) { return defaultRouteSource6() }
