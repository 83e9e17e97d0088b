// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
)

// TestBanNotDodged checks that a ban is not dodged by what a client
// chooses (issue 25, hole 6): its host name in other capitals or with a
// trailing dot, or another address of the same IPv6 /64 (a privacy
// address). Other tokens, and other networks, are not banned.
func TestBanNotDodged(t *testing.T) {
	var a admission
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.banLocked("tok", "cn1.example", netip.MustParseAddr("2001:db8:1:2::10"), now.Add(time.Hour), "test", now)
	a.banLocked("tok", "cn2", netip.MustParseAddr("192.0.2.20"), now.Add(time.Hour), "test", now)
	for _, tc := range []struct {
		token, host, addr string
		banned            bool
	}{
		{"tok", "cn1.example", "198.51.100.1", true},
		{"tok", "CN1.Example", "198.51.100.1", true},
		{"tok", "cn1.example.", "198.51.100.1", true},
		{"tok", "other", "2001:db8:1:2:abcd:ef01:2345:6789", true},
		{"tok", "other", "::ffff:192.0.2.20", true},
		{"tok", "other", "2001:db8:1:3::10", false},
		{"tok", "other", "198.51.100.1", false},
		{"else", "cn1.example", "2001:db8:1:2::10", false},
	} {
		err := a.bannedLocked(tc.token, tc.host, netip.MustParseAddr(tc.addr), now)
		if got := errors.Is(err, control.ErrBanned); got != tc.banned {
			t.Errorf("token %s host %q from %s: banned %v (%v), want %v", tc.token, tc.host, tc.addr, got, err, tc.banned)
		}
	}
}
