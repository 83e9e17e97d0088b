// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/identity"
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
		err := a.bannedLocked(identity.Job{Token: tc.token, Claimed: identity.Claimed{Hostname: tc.host}, Remote: netip.AddrPortFrom(netip.MustParseAddr(tc.addr), 1)}, now)
		if got := errors.Is(err, control.ErrBanned); got != tc.banned {
			t.Errorf("token %s host %q from %s: banned %v (%v), want %v", tc.token, tc.host, tc.addr, got, err, tc.banned)
		}
	}
}

// TestBanAttested: a ban of a job whose identity was attested sticks to
// the person (issue 33, item 2): its attested uid with any token or none,
// from any node and any address; and, from its node, the unattested joins
// of its token or claiming its uid (the same user leaving out the
// credential); not the other
// users of its node, whose joins are attested. The leases it covers
// follow the same rule.
func TestBanAttested(t *testing.T) {
	var a admission
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	uid := uint32(1000)
	node := netip.MustParseAddr("10.1.2.3")
	b := store.Ban{Token: "tok", UID: &uid, Addr: node, Until: now.Add(time.Hour), Reason: "test"}
	a.banLocked(b, now)
	other := uint32(1001)
	elsewhere := netip.MustParseAddr("10.9.9.9")
	for _, tc := range []struct {
		name, token string
		addr        netip.Addr
		uid         *uint32
		banned      bool
	}{
		{"the banned uid, same token, another node", "tok", elsewhere, &uid, true},
		{"the banned uid, another token", "other", elsewhere, &uid, true},
		{"the banned uid, no token", "", node, &uid, true},
		{"unattested, the token, from the node", "tok", node, nil, true},
		{"unattested, another token, from the node, claiming the uid", "other", node, nil, true},
		{"unattested, another token, from the node", "other", node, nil, false},
		{"unattested, the token, another node", "tok", elsewhere, nil, false},
		{"another user of the node, the token", "tok", node, &other, false},
		{"another user of the node, no token", "", node, &other, false},
	} {
		o := identity.Job{Token: tc.token, Remote: netip.AddrPortFrom(tc.addr, 1), Claimed: identity.Claimed{Hostname: "cn1", UID: 1001}}
		if strings.Contains(tc.name, "claiming the uid") {
			o.Claimed.UID = int(uid)
		}
		if tc.uid != nil {
			o.Attested = &identity.Attestation{By: "munge", UID: *tc.uid}
		}
		err := a.bannedLocked(o, now)
		if got := errors.Is(err, control.ErrBanned); got != tc.banned {
			t.Errorf("%s: banned %v (%v), want %v", tc.name, got, err, tc.banned)
		}
		if got := banCovers(b, o); got != tc.banned {
			t.Errorf("%s: banCovers %v, want %v (a lease ends as a join is refused)", tc.name, got, tc.banned)
		}
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
	alice := &identity.Issued{Issuer: "https://iss", Subject: "alice"}
	err := a.bannedLocked(identity.Job{Token: "other-token", Claimed: identity.Claimed{Hostname: "cn9"}, Remote: netip.MustParseAddrPort("10.9.9.9:1"), Issued: alice}, now)
	if !errors.Is(err, control.ErrBanned) || !strings.Contains(err.Error(), `subject "alice" of issuer https://iss`) {
		t.Errorf("the banned subject with another token from another node: %v, want banned naming the subject", err)
	}
	for _, id := range []*identity.Issued{nil, {Issuer: "https://iss", Subject: "bob"}, {Issuer: "https://other", Subject: "alice"}} {
		if err := a.bannedLocked(identity.Job{Token: "cms", Claimed: identity.Claimed{Hostname: "cn1"}, Remote: netip.AddrPortFrom(node, 1), Issued: id}, now); err != nil {
			t.Errorf("%v from the banned job's node: %v, want not banned", id, err)
		}
	}
	b := store.Ban{Issuer: "https://iss", Subject: "alice"}
	at := func(id *identity.Issued) identity.Job {
		return identity.Job{Token: "cms", Remote: netip.AddrPortFrom(node, 1), Claimed: identity.Claimed{Hostname: "x"}, Issued: id}
	}
	if !banCovers(b, at(alice)) || banCovers(b, at(&identity.Issued{Issuer: "https://iss", Subject: "bob"})) || banCovers(b, at(nil)) {
		t.Error("banCovers does not follow the subject")
	}
	if err := b.Valid(); err != nil {
		t.Errorf("subject ban: %v", err)
	}
}
