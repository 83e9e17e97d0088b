// SPDX-License-Identifier: MIT

package main

import (
	"fmt"
	"net/netip"
)

// parseWhoisAddr parses whois's argument: IP:PORT, [IPV6]:PORT, or a bare
// IP (port 0), which finds jobs' own public IPv6 addresses by address
// alone.
func parseWhoisAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return netip.AddrPortFrom(a.Unmap(), 0), nil
	}
	return netip.AddrPort{}, fmt.Errorf("whois: bad address %q: want IP:PORT, e.g. 203.0.113.1:20311 or [2001:db8::1]:20311, or a bare IP for a job's own IPv6 address", truncateArg(s))
}

// truncateArg bounds an argument echoed in an error.
func truncateArg(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
