// SPDX-License-Identifier: MIT

package jobs

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

func TestIndex(t *testing.T) {
	var x Index
	a4, a6 := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("fd00::6440:2")
	if err := x.Add("L1", a4, a6); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{a4, a6, netip.MustParseAddr("::ffff:100.64.0.2")} {
		if id, ok := x.Lookup(a); !ok || id != "L1" {
			t.Errorf("Lookup(%v) = %q, %v; want L1", a, id, ok)
		}
	}
	if got := x.Addrs("L1"); !slices.Equal(got, []netip.Addr{a4, a6}) {
		t.Errorf("Addrs = %v", got)
	}
	tests := []struct {
		name  string
		id    ID
		addrs []netip.Addr
		want  error
	}{
		{"id again", "L1", []netip.Addr{netip.MustParseAddr("100.64.0.9")}, ErrExists},
		{"address of another job", "L2", []netip.Addr{netip.MustParseAddr("100.64.0.3"), a6}, ErrAddrInUse},
		{"address twice", "L2", []netip.Addr{netip.MustParseAddr("100.64.0.3"), netip.MustParseAddr("100.64.0.3")}, ErrAddrInUse},
	}
	for _, tc := range tests {
		if err := x.Add(tc.id, tc.addrs...); !errors.Is(err, tc.want) {
			t.Errorf("%s: Add = %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := x.Add("", a4); err == nil {
		t.Error("Add with an empty id: accepted")
	}
	if err := x.Add("L3", netip.Addr{}); err == nil {
		t.Error("Add with an invalid address: accepted")
	}
	// A failed Add leaves nothing behind.
	if _, ok := x.Lookup(netip.MustParseAddr("100.64.0.3")); ok || x.Len() != 1 {
		t.Errorf("after failed adds: 100.64.0.3 indexed %v, %d jobs; want none, 1", ok, x.Len())
	}
	x.Remove("L1")
	if _, ok := x.Lookup(a4); ok || x.Addrs("L1") != nil || x.Len() != 0 {
		t.Error("L1 still indexed after Remove")
	}
	x.Remove("L1") // a no-op
	if err := x.Add("L2", a4); err != nil {
		t.Errorf("the address again after Remove: %v", err)
	}
}

func TestLookupAllocs(t *testing.T) {
	var x Index
	a := netip.MustParseAddr("100.64.0.2")
	if err := x.Add("L1", a); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { x.Lookup(a) }); n != 0 {
		t.Errorf("Lookup allocates %v times, want 0", n)
	}
}
