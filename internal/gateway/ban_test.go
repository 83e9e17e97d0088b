// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/store"
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
	a.banLocked(store.Ban{Token: "tok", Host: "cn1.example", Addr: netip.MustParseAddr("2001:db8:1:2::10"), Until: now.Add(time.Hour), Reason: "test"}, now)
	a.banLocked(store.Ban{Token: "tok", Host: "cn2", Addr: netip.MustParseAddr("192.0.2.20"), Until: now.Add(time.Hour), Reason: "test"}, now)
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
		err := a.bannedLocked(tc.token, tc.host, netip.MustParseAddr(tc.addr), nil, nil, now)
		if got := errors.Is(err, control.ErrBanned); got != tc.banned {
			t.Errorf("token %s host %q from %s: banned %v (%v), want %v", tc.token, tc.host, tc.addr, got, err, tc.banned)
		}
	}
}

// TestBanAttested: a ban of a job whose identity was attested covers its
// attested uid, from any node and any address, and not the other users
// of its node (issue 25, hole 6).
func TestBanAttested(t *testing.T) {
	var a admission
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	uid := uint32(1000)
	a.banLocked(store.Ban{UID: &uid, Until: now.Add(time.Hour), Reason: "test"}, now)
	other := uint32(1001)
	node := netip.MustParseAddr("10.1.2.3")
	if err := a.bannedLocked("", "cn9", netip.MustParseAddr("10.9.9.9"), &uid, nil, now); !errors.Is(err, control.ErrBanned) {
		t.Errorf("the banned uid from another node: %v, want banned", err)
	}
	if err := a.bannedLocked("", "cn1", node, &other, nil, now); err != nil {
		t.Errorf("another user of the banned job's node: %v, want not banned", err)
	}
	if err := a.bannedLocked("", "cn1", node, nil, nil, now); err != nil {
		t.Errorf("an unattested join from the banned job's node: %v, want not banned", err)
	}
	if !banCovers(store.Ban{UID: &uid}, "x", node, &uid, nil) || banCovers(store.Ban{UID: &uid}, "x", node, &other, nil) {
		t.Error("banCovers does not follow the attested uid")
	}
}

// TestBanSubject: a ban of a job identified by an issuer-verified bearer
// token covers its issuer and subject, with any token (name), from any
// node, address or uid; not another subject of that issuer, nor the same
// subject name of another issuer.
func TestBanSubject(t *testing.T) {
	var a admission
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.banLocked(store.Ban{Token: "cms", Issuer: "https://iss", Subject: "alice", Until: now.Add(time.Hour), Reason: "test"}, now)
	node := netip.MustParseAddr("10.1.2.3")
	alice := &store.Issued{Issuer: "https://iss", Subject: "alice"}
	err := a.bannedLocked("other-token", "cn9", netip.MustParseAddr("10.9.9.9"), nil, alice, now)
	if !errors.Is(err, control.ErrBanned) || !strings.Contains(err.Error(), `subject "alice" of issuer https://iss`) {
		t.Errorf("the banned subject with another token from another node: %v, want banned naming the subject", err)
	}
	for _, id := range []*store.Issued{nil, {Issuer: "https://iss", Subject: "bob"}, {Issuer: "https://other", Subject: "alice"}} {
		if err := a.bannedLocked("cms", "cn1", node, nil, id, now); err != nil {
			t.Errorf("%v from the banned job's node: %v, want not banned", id, err)
		}
	}
	b := store.Ban{Issuer: "https://iss", Subject: "alice"}
	if !banCovers(b, "x", node, nil, alice) || banCovers(b, "x", node, nil, &store.Issued{Issuer: "https://iss", Subject: "bob"}) || banCovers(b, "x", node, nil, nil) {
		t.Error("banCovers does not follow the subject")
	}
	if err := b.Valid(); err != nil {
		t.Errorf("subject ban: %v", err)
	}
}
