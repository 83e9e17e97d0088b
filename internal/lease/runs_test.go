// SPDX-License-Identifier: MIT

package lease

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"
)

// TestAllocateRun: with 2 addresses × 4 blocks (stride 2), runs stay on
// one address (one residue mod 2), never pass the last block, free all
// their blocks on release, and a run that does not fit is refused.
func TestAllocateRun(t *testing.T) {
	m, err := NewStride(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 8, 2)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	key := func(i byte) [32]byte { return [32]byte{i} }
	a, _, _, err := m.AllocateRun(key(1), identity.Job{}, now, 3)
	if err != nil {
		t.Fatal(err)
	}
	if a.Block != 0 || a.Blocks != 3 {
		t.Fatalf("first run: block %d ×%d, want 0 ×3", a.Block, a.Blocks)
	}
	if got, want := m.run(a), []int{0, 2, 4}; !slices.Equal(got, want) {
		t.Errorf("run = %v, want %v", got, want)
	}
	if got := m.BlocksUsed(); got != 3 {
		t.Errorf("BlocksUsed = %d, want 3", got)
	}
	// Blocks 1, 3, 5 are the only run of 3 left; after it, 6 and 7 are
	// free but no run of 2 fits (6+2 and 7+2 are past the end).
	b, _, _, err := m.AllocateRun(key(2), identity.Job{}, now, 3)
	if err != nil || b.Block != 1 {
		t.Fatalf("second run: block %d, err %v; want 1", b.Block, err)
	}
	if _, _, _, err := m.AllocateRun(key(3), identity.Job{}, now, 2); !errors.Is(err, ErrNoPortBlock) {
		t.Fatalf("run of 2 with blocks 6, 7 free: err %v, want ErrNoPortBlock", err)
	}
	if _, _, _, err := m.AllocateRun(key(4), identity.Job{}, now, 5); !errors.Is(err, ErrNoPortBlock) {
		t.Fatalf("run longer than an address: err %v, want ErrNoPortBlock", err)
	}
	c, _, _, err := m.AllocateRun(key(5), identity.Job{}, now, 1)
	if err != nil || (c.Block != 6 && c.Block != 7) {
		t.Fatalf("single block: %d, %v; want 6 or 7", c.Block, err)
	}
	if _, err := m.Remove(a.ID); err != nil {
		t.Fatal(err)
	}
	if got := m.BlocksUsed(); got != 4 {
		t.Errorf("BlocksUsed after removing the 3-run = %d, want 4", got)
	}
	d, _, _, err := m.AllocateRun(key(6), identity.Job{}, now, 3)
	if err != nil || d.Block != 0 {
		t.Fatalf("run of 3 after release: block %d, %v; want 0", d.Block, err)
	}
	if _, _, _, err := m.AllocateRun(key(7), identity.Job{}, now, 0); err == nil {
		t.Error("run of 0 blocks allowed")
	}
}

// TestRestoreRun: a restored run holds all its blocks, and a run that
// overlaps a held block or passes the end is refused.
func TestRestoreRun(t *testing.T) {
	m, _ := NewStride(netip.MustParsePrefix("100.64.0.0/24"), netip.MustParseAddr("100.64.0.1"), time.Minute, 8, 2)
	now := time.Now()
	l := Lease{ID: "a", Addrs: []netip.Prefix{netip.MustParsePrefix("100.64.0.2/24")}, Block: 1, Blocks: 3, PublicKey: [32]byte{1}, Start: now, Expires: now.Add(time.Minute)}
	if _, err := m.Restore(l, [32]byte{}); err != nil {
		t.Fatal(err)
	}
	if got := m.BlocksUsed(); got != 3 {
		t.Errorf("BlocksUsed = %d, want 3", got)
	}
	for _, tc := range []struct {
		block, blocks int
	}{{5, 1}, {3, 2}, {6, 2}, {7, 1 + 1}} {
		r := Lease{ID: "b", Addrs: []netip.Prefix{netip.MustParsePrefix("100.64.0.3/24")}, Block: tc.block, Blocks: tc.blocks, PublicKey: [32]byte{2}, Start: now, Expires: now.Add(time.Minute)}
		if _, err := m.Restore(r, [32]byte{}); err == nil {
			t.Errorf("restore of blocks %d ×%d next to 1 ×3 of 8 (stride 2) succeeded", tc.block, tc.blocks)
			_, _ = m.Remove("b")
		}
	}
	r := Lease{ID: "c", Addrs: []netip.Prefix{netip.MustParsePrefix("100.64.0.4/24")}, Block: 0, Blocks: 4, PublicKey: [32]byte{3}, Start: now, Expires: now.Add(time.Minute)}
	if _, err := m.Restore(r, [32]byte{}); err != nil {
		t.Errorf("restore of 0 ×4: %v", err)
	}
}
