// SPDX-License-Identifier: MIT

package lease

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"
)

func TestAllocateSkipsReserved(t *testing.T) {
	m, err := New(netip.MustParsePrefix("100.64.0.0/29"), netip.MustParseAddr("100.64.0.1"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	var got []netip.Addr
	for i := 0; i < 5; i++ {
		l, _, _, err := m.Allocate([32]byte{byte(i + 1)}, identity.Job{}, now)
		if err != nil {
			t.Fatalf("allocate %d: %v", i, err)
		}
		got = append(got, l.Addr())
	}
	want := []string{"100.64.0.2", "100.64.0.3", "100.64.0.4", "100.64.0.5", "100.64.0.6"}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("lease %d: got %v, want %v", i, got[i], want[i])
		}
	}
	if _, _, _, err := m.Allocate([32]byte{99}, identity.Job{}, now); !errors.Is(err, ErrNoAddress) {
		t.Fatalf("full subnet: got %v, want ErrNoAddress", err)
	}
}

func TestRenewReleaseExpire(t *testing.T) {
	m, err := New(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	l, secret, _, err := m.Allocate([32]byte{1}, identity.Job{Token: "job"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Renew(l.ID, "wrong", now); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("renew with wrong secret: got %v, want ErrUnknownLease", err)
	}
	r, err := m.Renew(l.ID, secret, now.Add(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(90 * time.Second); !r.Expires.Equal(want) {
		t.Errorf("renewed expiry: got %v, want %v", r.Expires, want)
	}
	if exp := m.Expire(now.Add(80 * time.Second)); len(exp) != 0 {
		t.Errorf("expired too early: %v", exp)
	}
	if exp := m.Expire(now.Add(91 * time.Second)); len(exp) != 1 || exp[0].ID != l.ID {
		t.Errorf("expire: got %v, want lease %s", exp, l.ID)
	}
	if m.Len() != 0 {
		t.Errorf("len after expiry: got %d, want 0", m.Len())
	}
	l2, s2, _, err := m.Allocate([32]byte{2}, identity.Job{}, now)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Addr() == l.Addr() {
		t.Errorf("freed address reused at once: %v", l2.Addr())
	}
	if _, err := m.Release(l2.ID, s2); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Release(l2.ID, s2); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("double release: got %v, want ErrUnknownLease", err)
	}
}

func TestSameKeyReplaces(t *testing.T) {
	m, _ := New(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 0)
	now := time.Now()
	a, _, _, _ := m.Allocate([32]byte{7}, identity.Job{}, now)
	_, _, replaced, err := m.Allocate([32]byte{7}, identity.Job{}, now)
	if err != nil {
		t.Fatal(err)
	}
	if replaced == nil || replaced.ID != a.ID {
		t.Fatalf("replaced: got %v, want lease %s", replaced, a.ID)
	}
	if m.Len() != 1 {
		t.Errorf("len: got %d, want 1", m.Len())
	}
}

func TestAllocateIPv6(t *testing.T) {
	m, err := New(netip.MustParsePrefix("fd00::/120"), netip.MustParseAddr("fd00::1"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	l, _, _, err := m.Allocate([32]byte{1}, identity.Job{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := l.Addr().String(), "fd00::2"; got != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestPortBlocks(t *testing.T) {
	m, err := New(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 2)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a, sa, _, err := m.Allocate([32]byte{1}, identity.Job{}, now)
	if err != nil || a.Block != 0 {
		t.Fatalf("first lease: block %d, %v; want 0", a.Block, err)
	}
	b, _, _, err := m.Allocate([32]byte{2}, identity.Job{}, now)
	if err != nil || b.Block != 1 {
		t.Fatalf("second lease: block %d, %v; want 1", b.Block, err)
	}
	if _, _, _, err := m.Allocate([32]byte{3}, identity.Job{}, now); !errors.Is(err, ErrNoPortBlock) {
		t.Fatalf("third lease: got %v, want ErrNoPortBlock", err)
	}
	if m.Len() != 2 {
		t.Fatalf("a refused join left a lease behind: %d leases", m.Len())
	}
	if _, err := m.Release(a.ID, sa); err != nil {
		t.Fatal(err)
	}
	c, _, _, err := m.Allocate([32]byte{3}, identity.Job{}, now)
	if err != nil || c.Block != 0 {
		t.Fatalf("after release: block %d, %v; want 0", c.Block, err)
	}
	if got, ok := m.ByID(c.ID); !ok || got.Addr() != c.Addr() {
		t.Errorf("ByID(%v): got %v, %v", c.ID, got.Addr(), ok)
	}
}

func TestRemove(t *testing.T) {
	m, err := New(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 0)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	l, secret, _, err := m.Allocate([32]byte{1}, identity.Job{}, now)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Remove(l.ID)
	if err != nil || got.Addr() != l.Addr() {
		t.Fatalf("Remove: got %v, %v; want the lease of %s", got, err, l.Addr())
	}
	if _, err := m.Renew(l.ID, secret, now); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("Renew after Remove: got %v, want ErrUnknownLease", err)
	}
	if _, ok := m.ByID(l.ID); ok || m.Len() != 0 {
		t.Errorf("lease still held after Remove")
	}
	if _, err := m.Remove(l.ID); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("second Remove: got %v, want ErrUnknownLease", err)
	}
}

func TestRestore(t *testing.T) {
	m, err := New(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 4)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	l, secret, _, err := m.Allocate([32]byte{1}, identity.Job{}, now)
	if err != nil {
		t.Fatal(err)
	}
	// A second manager (the restarted gateway) takes the lease back.
	m2, _ := New(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 4)
	if _, err := m2.Restore(l, l.SecretHash()); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if _, err := m2.Renew(l.ID, secret, now); err != nil {
		t.Errorf("renew restored lease: %v", err)
	}
	if _, err := m2.Check(l.ID, "wrong", now); err != ErrUnknownLease {
		t.Errorf("check with a wrong secret: got %v", err)
	}
	if _, err := m2.Restore(l, l.SecretHash()); err == nil {
		t.Errorf("restoring the same lease twice succeeded")
	}
	// New leases avoid the restored address and block.
	n, _, _, err := m2.Allocate([32]byte{2}, identity.Job{}, now)
	if err != nil || n.Addr() == l.Addr() || n.Block == l.Block {
		t.Errorf("new lease %+v, %v collides with restored %+v", n, err, l)
	}
	bad := l
	bad.ID, bad.PublicKey, bad.Addrs, bad.Block = "x", [32]byte{3}, []netip.Prefix{netip.MustParsePrefix("100.65.0.9/24")}, 1
	if _, err := m2.Restore(bad, l.SecretHash()); err == nil {
		t.Errorf("restored an address outside the subnet")
	}
	bad.Addrs, bad.Block = []netip.Prefix{netip.MustParsePrefix("100.64.0.77/24")}, 9
	if _, err := m2.Restore(bad, l.SecretHash()); err == nil {
		t.Errorf("restored a block that does not exist")
	}
	if _, err := m2.Remove(l.ID); err != nil {
		t.Fatal(err)
	}
	if m2.Len() != 1 {
		t.Errorf("after Remove: %d leases, want 1", m2.Len())
	}
}
