// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"net"
	"net/netip"
)

// ResolveEndpoint resolves a lease's WireGuard endpoint (HOST:PORT) as
// airlock run does: an empty or unspecified host means the host of the
// control address controlAddr, and IPv4 is preferred.
func ResolveEndpoint(ctx context.Context, endpoint, controlAddr string) (netip.AddrPort, error) {
	return resolveEndpoint(ctx, endpoint, controlAddr)
}

// pickEndpoint chooses among a gateway name's addresses: the first IPv4
// address this node has a route to, else the first IPv6 one it has a route
// to (an IPv6-only node), else the first IPv4, else the first address.
func pickEndpoint(addrs []netip.Addr, port uint16, routable func(netip.AddrPort) bool) netip.AddrPort {
	var v4, v6 []netip.AddrPort
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a.Unmap(), port)
		if ap.Addr().Is4() {
			v4 = append(v4, ap)
		} else {
			v6 = append(v6, ap)
		}
	}
	for _, ap := range append(append([]netip.AddrPort(nil), v4...), v6...) {
		if routable(ap) {
			return ap
		}
	}
	if len(v4) > 0 {
		return v4[0]
	}
	return netip.AddrPortFrom(addrs[0].Unmap(), port)
}

// routable reports whether this node has a route to ap: connecting a UDP
// socket resolves the route without sending anything.
func routable(ap netip.AddrPort) bool {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ap))
	if err != nil {
		return false
	}
	c.Close()
	return true
}
