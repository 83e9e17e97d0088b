// SPDX-License-Identifier: MIT

package netstack

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/forward/forwardtest"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// TestLocalRoutesAreHost (issue 25, hole 1): user mode's --egress-prefix
// needs `ip -6 route add local PREFIX dev lo`, which makes every address
// of the prefix the host's own: a service bound to [::] answers on
// [PREFIX::1] too. The floor's host check must refuse them like the
// host's interface addresses, and any other destination the host routes
// as local.
func TestLocalRoutesAreHost(t *testing.T) {
	if !forwardtest.Isolate(t) {
		return
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"2001:db8:99::/64", "192.0.2.0/24"} {
		_, dst, _ := net.ParseCIDR(p)
		r := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst, Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST}
		if err := netlink.RouteAdd(r); err != nil {
			t.Fatalf("ip route add local %s dev lo: %v", p, err)
		}
	}
	s, err := New(Config{Logger: testLogger(), Addrs: []netip.Prefix{gwPrefix}, Dial: newDialer().Dial,
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := netip.AddrPortFrom(jobAddr, 40000)
	for _, dst := range []string{"[2001:db8:99::1]:22", "[2001:db8:99::ffff:1]:8080", "192.0.2.5:22", "[64:ff9b::c000:205]:22"} {
		err := s.checkFlow(src, policy.ProtoTCP, netip.MustParseAddrPort(dst))
		if !errors.Is(err, ErrDestinationDenied) || !strings.Contains(err.Error(), "rule "+policy.RuleHost+")") {
			t.Errorf("checkFlow(%s), local to the gateway host: %v, want denied by %s", dst, err, policy.RuleHost)
		}
	}
	if err := s.checkFlow(src, policy.ProtoTCP, netip.MustParseAddrPort("[2001:db8:98::1]:22")); err != nil {
		t.Errorf("checkFlow outside the local prefix: %v, want allowed", err)
	}
}
