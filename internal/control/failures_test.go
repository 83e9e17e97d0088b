// SPDX-License-Identifier: MIT

package control

import (
	"net/netip"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

func TestFailureLimiter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFailureLimiter[netip.Prefix](rate.Every(2*time.Second), 2)
	a := netip.MustParseAddr("192.0.2.1")
	b := netip.MustParseAddr("192.0.2.2")
	v6a := netip.MustParseAddr("2001:db8::1")
	v6b := netip.MustParseAddr("2001:db8::ffff")  // same /64
	v6c := netip.MustParseAddr("2001:db8:0:1::1") // other /64

	steps := []struct {
		fail        []netip.Addr
		at          time.Duration
		addr        netip.Addr
		wantLimited bool
	}{
		{nil, 0, a, false},
		{[]netip.Addr{a}, 0, a, false},
		{[]netip.Addr{a}, 0, a, true},
		{nil, 0, b, false},
		{nil, 1 * time.Second, a, true},
		{nil, 2 * time.Second, a, false},
		{[]netip.Addr{v6a, v6a}, 2 * time.Second, v6b, true},
		{nil, 2 * time.Second, v6c, false},
		{nil, 2 * time.Second, netip.MustParseAddr("::ffff:192.0.2.1"), false},
	}
	for i, s := range steps {
		at := now.Add(s.at)
		for _, addr := range s.fail {
			f.fail(peerKey(addr), at)
		}
		wait, limited := f.limited(peerKey(s.addr), at)
		if limited != s.wantLimited {
			t.Errorf("step %d: limited(%v) = %v, want %v", i, s.addr, limited, s.wantLimited)
		}
		if limited && (wait <= 0 || wait > 2*time.Second) {
			t.Errorf("step %d: wait %v, want in (0, 2s]", i, wait)
		}
	}
	// Full buckets are swept once the interval has passed.
	f.fail(peerKey(b), now.Add(time.Hour))
	if got := f.size(); got != 1 {
		t.Errorf("got %d tracked networks after sweep, want 1", got)
	}
}
