// SPDX-License-Identifier: MIT

package client

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestParseGateways: AIRLOCK_GATEWAY takes addresses of either family
// (IPv6 bracketed), alone and in a list, and refuses an address without
// its port.
func TestParseGateways(t *testing.T) {
	pin := "sha256:" + strings.Repeat("ab", 32)
	for _, tc := range []struct {
		family, addr, other, bad string
	}{
		{"IPv4", "198.51.100.1:8443", "[2001:db8::1]:8443", "198.51.100.1"},
		{"IPv6", "[2001:db8::1]:8443", "198.51.100.1:8443", "2001:db8::1:8443"},
	} {
		t.Run(tc.family, func(t *testing.T) {
			gws, err := ParseGateways(tc.addr+", "+tc.other, pin, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if len(gws) != 2 || gws[0].Addr != tc.addr {
				t.Errorf("got %+v, want %s first", gws, tc.addr)
			}
			if _, err := ParseGateways(tc.bad, pin, time.Second); err == nil {
				t.Errorf("%s: no error", tc.bad)
			}
		})
	}
}

// TestPickEndpoint: IPv4 first where routable, else a routable IPv6
// address (an IPv6-only node).
func TestPickEndpoint(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("2001:db8::1")
	all := func(netip.AddrPort) bool { return true }
	only6 := func(ap netip.AddrPort) bool { return ap.Addr().Is6() }
	none := func(netip.AddrPort) bool { return false }
	for _, tc := range []struct {
		addrs    []netip.Addr
		routable func(netip.AddrPort) bool
		want     netip.Addr
	}{
		{[]netip.Addr{v6, v4}, all, v4},
		{[]netip.Addr{v4, v6}, only6, v6},
		{[]netip.Addr{v6, v4}, none, v4},
		{[]netip.Addr{v6}, none, v6},
	} {
		if got := pickEndpoint(tc.addrs, 8443, tc.routable); got != netip.AddrPortFrom(tc.want, 8443) {
			t.Errorf("pickEndpoint(%v) = %v, want %v", tc.addrs, got, tc.want)
		}
	}
}
