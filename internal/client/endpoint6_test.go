// SPDX-License-Identifier: MIT

package client

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestParseGatewaysIPv6: AIRLOCK_GATEWAY takes bracketed IPv6 addresses,
// alone and in a list.
func TestParseGatewaysIPv6(t *testing.T) {
	pin := "sha256:" + strings.Repeat("ab", 32)
	gws, err := ParseGateways("[2001:db8::1]:8443, 198.51.100.1:8443", pin, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(gws) != 2 || gws[0].Addr != "[2001:db8::1]:8443" {
		t.Errorf("got %+v, want [2001:db8::1]:8443 first", gws)
	}
	if _, err := ParseGateways("2001:db8::1:8443", pin, time.Second); err == nil {
		t.Error("unbracketed IPv6 address: no error")
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
