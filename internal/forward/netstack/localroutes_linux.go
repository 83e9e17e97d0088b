// SPDX-License-Identifier: MIT

package netstack

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// localRoutes lists the destinations of this network namespace's local
// routes (table local, type local) that are prefixes, not single
// addresses (those are the interfaces' own, in hostAddrs' list), except
// loopback's 127.0.0.0/8, which the floor denies anyway.
func localRoutes() ([]netip.Prefix, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_LOCAL, Type: unix.RTN_LOCAL},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE)
	if err != nil {
		return nil, fmt.Errorf("list local routes: %w", err)
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		p := netip.PrefixFrom(a.Unmap(), ones).Masked()
		if p.IsSingleIP() || p.Addr().IsLoopback() {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}
