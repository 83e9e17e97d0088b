// SPDX-License-Identifier: MIT

package lease

import (
	"net/netip"
	"testing"
	"time"
)

func TestEmbed6(t *testing.T) {
	p := netip.MustParsePrefix("fd12:3456:789a::/48")
	a := Embed6(p, netip.MustParseAddr("100.64.0.2"))
	if want := netip.MustParseAddr("fd12:3456:789a::6440:2"); a != want {
		t.Errorf("Embed6 = %v, want %v", a, want)
	}
	if v4, ok := Extract4(p, a); !ok || v4 != netip.MustParseAddr("100.64.0.2") {
		t.Errorf("Extract4(%v) = %v, %v", a, v4, ok)
	}
	if _, ok := Extract4(p, netip.MustParseAddr("fd00::1")); ok {
		t.Error("Extract4 of an address outside the prefix: ok")
	}
	for _, bad := range []string{"fd00::/97", "10.0.0.0/8", "::ffff:0:0/96"} {
		if err := CheckPrefix6(netip.MustParsePrefix(bad)); err == nil {
			t.Errorf("CheckPrefix6(%s): no error", bad)
		}
	}
}

// TestDualStackLeases: leases carry the IPv6 address that embeds their
// IPv4 one, also when restored; ByAddr finds them by either.
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
	if got, want := m.Gateway6(), netip.MustParseAddr("fd12:3456:789a::6440:1"); got != want {
		t.Errorf("Gateway6 = %v, want %v", got, want)
	}
	now := time.Now()
	l, secret, _, err := m.Allocate([32]byte{1}, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if l.Addr6 != Embed6(p6, l.Addr) {
		t.Errorf("lease %v has IPv6 address %v, want %v", l.Addr, l.Addr6, Embed6(p6, l.Addr))
	}
	if got, ok := m.ByAddr(l.Addr6); !ok || got.ID != l.ID {
		t.Errorf("ByAddr(%v) = %v, %v", l.Addr6, got.ID, ok)
	}
	if _, err := m.Release(l.ID, secret); err != nil {
		t.Fatal(err)
	}
	r := Lease{ID: "r", Addr: netip.MustParseAddr("100.64.0.9"), Block: -1, PublicKey: [32]byte{2}, Start: now, Expires: now.Add(time.Minute)}
	if err := m.Restore(r, [32]byte{}); err != nil {
		t.Fatal(err)
	}
	if got, ok := m.ByAddr(netip.MustParseAddr("fd12:3456:789a::6440:9")); !ok || got.Addr6 != netip.MustParseAddr("fd12:3456:789a::6440:9") {
		t.Errorf("restored lease: %+v, %v", got, ok)
	}
}
