// SPDX-License-Identifier: MIT

package lease

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

func TestEmbed6(t *testing.T) {
	p := netip.MustParsePrefix("fd12:3456:789a::/48")
	a := Embed6(p, netip.MustParseAddr("100.64.0.2"))
	if want := netip.MustParseAddr("fd12:3456:789a::6440:2"); a != want {
		t.Errorf("Embed6 = %v, want %v", a, want)
	}
	for _, bad := range []string{"fd00::/97", "10.0.0.0/8", "::ffff:0:0/96"} {
		if err := CheckPrefix6(netip.MustParsePrefix(bad)); err == nil {
			t.Errorf("CheckPrefix6(%s): no error", bad)
		}
	}
}

// TestDualStackLeases: leases carry the IPv6 address that embeds their
// IPv4 one, also when restored.
func TestDualStackLeases(t *testing.T) {
	m, err := New(netip.MustParsePrefix("100.64.0.0/16"), netip.MustParseAddr("100.64.0.1"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	p6 := netip.MustParsePrefix("fd12:3456:789a::/48")
	if err := m.SetPrefix6(netip.MustParsePrefix("fd12::/112")); err == nil {
		t.Error("SetPrefix6 /112: no error")
	}
	if err := m.SetPrefix6(p6); err != nil {
		t.Fatal(err)
	}
	if got, want := m.GatewayAddr(ipfamily.V6), netip.MustParseAddr("fd12:3456:789a::6440:1"); got != want {
		t.Errorf("GatewayAddr(IPv6) = %v, want %v", got, want)
	}
	if got, want := m.GatewayAddr(ipfamily.V4), netip.MustParseAddr("100.64.0.1"); got != want {
		t.Errorf("GatewayAddr(IPv4) = %v, want %v", got, want)
	}
	if got := [2]netip.Prefix{m.Prefix(ipfamily.V4), m.Prefix(ipfamily.V6)}; got != [2]netip.Prefix{netip.MustParsePrefix("100.64.0.0/16"), p6} {
		t.Errorf("Prefix(IPv4), Prefix(IPv6) = %v", got)
	}
	now := time.Now()
	l, secret, _, err := m.Allocate([32]byte{1}, identity.Job{}, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.PrefixFrom(l.Addr(), 16), netip.PrefixFrom(Embed6(p6, l.Addr()), 48)}
	if !slices.Equal(l.Addrs, want) {
		t.Errorf("lease addresses %v, want %v", l.Addrs, want)
	}
	if _, err := m.Release(l.ID, secret); err != nil {
		t.Fatal(err)
	}
	r := Lease{ID: "r", Addrs: []netip.Prefix{netip.MustParsePrefix("100.64.0.9/32")}, Block: -1, PublicKey: [32]byte{2}, Start: now, Expires: now.Add(time.Minute)}
	got, err := m.Restore(r, [32]byte{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{netip.MustParseAddr("100.64.0.9"), netip.MustParseAddr("fd12:3456:789a::6440:9")}; !slices.Equal(got.AddrList(), want) {
		t.Errorf("restored lease: %v, want %v", got.Addrs, want)
	}
	if l, ok := m.ByID("r"); !ok || !slices.Equal(l.Addrs, got.Addrs) {
		t.Errorf("ByID of the restored lease: %+v, %v", l, ok)
	}
}
