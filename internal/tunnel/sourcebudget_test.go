// SPDX-License-Identifier: MIT

package tunnel

import (
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// allowed counts how many of n handshakes from ip the budget admits at
// once.
func allowed(b *sourceBudget, ip netip.Addr, n int) int {
	ok := 0
	for range n {
		if b.Allow(ip) {
			ok++
		}
	}
	return ok
}

// perSecond counts the handshakes from ip the budget admits over a second
// of tries every 100 ms, after its bucket was emptied.
func perSecond(b *sourceBudget, ip netip.Addr, now *time.Time) int {
	allowed(b, ip, 30_000)
	n := 0
	for range 10 {
		*now = now.Add(100 * time.Millisecond)
		n += allowed(b, ip, 30_000)
	}
	return n
}

func testKey(i int) wgkey.Key {
	var k wgkey.Key
	k[0], k[1] = byte(i), byte(i>>8)
	return k
}

// TestSourceBudget: a source without peers gets upstream's budget (5 at
// once, 20 a second); one with peers behind it gets one more at once and
// one more every 2 s per peer, so 10,000 jobs behind a node's address can
// all handshake together; the budget follows a peer that moves and ends
// with it; a peer gone is not brought back by a late endpoint.
func TestSourceBudget(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	b := newSourceBudget(func() time.Time { return now })
	node := netip.MustParseAddr("198.51.100.2")
	other := netip.MustParseAddr("198.51.100.3")

	if got := allowed(b, other, 100); got != budgetBaseBurst {
		t.Errorf("a source without peers: %d handshakes at once, want upstream's %d", got, budgetBaseBurst)
	}
	if got := perSecond(b, other, &now); got != budgetBaseRate {
		t.Errorf("a source without peers: %d handshakes a second, want upstream's %d", got, budgetBaseRate)
	}

	const jobs = 10_000
	for i := range jobs {
		b.place(testKey(i), node)
	}
	if got := b.peersBehind(node); got != jobs {
		t.Fatalf("peers behind the node: %d, want %d", got, jobs)
	}
	if got := allowed(b, node, 2*jobs); got != budgetBaseBurst+jobs {
		t.Errorf("%d jobs behind one address: %d handshakes at once, want %d", jobs, got, budgetBaseBurst+jobs)
	}
	if got, want := perSecond(b, node, &now), budgetBaseRate+jobs/2; got != want {
		t.Errorf("%d jobs behind one address: %d handshakes a second, want %d (each job every 2 s)", jobs, got, want)
	}
	// The other source is not touched by the node's budget.
	now = now.Add(time.Second)
	if got := allowed(b, other, 100); got != budgetBaseBurst {
		t.Errorf("the other source after the node's storm: %d, want %d", got, budgetBaseBurst)
	}

	// A job that moves (its NAT mapping changed) takes its share along.
	b.move(testKey(0), other)
	if b.peersBehind(node) != jobs-1 || b.peersBehind(other) != 1 {
		t.Errorf("after a move: %d behind the node, %d behind the other, want %d and 1", b.peersBehind(node), b.peersBehind(other), jobs-1)
	}
	// Jobs that end take theirs; a late endpoint does not bring one back.
	for i := range jobs {
		b.forget(testKey(i))
	}
	b.move(testKey(1), node)
	if b.peersBehind(node) != 0 || b.peersBehind(other) != 0 {
		t.Errorf("after every job ended: %d and %d peers counted, want none", b.peersBehind(node), b.peersBehind(other))
	}
	now = now.Add(time.Hour)
	if got := allowed(b, node, 100); got != budgetBaseBurst {
		t.Errorf("the node without jobs: %d at once, want upstream's %d", got, budgetBaseBurst)
	}
	// Sources without peers whose buckets refilled are swept.
	now = now.Add(time.Hour)
	b.Allow(netip.MustParseAddr("192.0.2.1"))
	if len(b.sources) != 1 || b.strangers != 1 {
		t.Errorf("after a sweep: %d sources, %d without peers; want only the one just heard", len(b.sources), b.strangers)
	}
}

// TestSourceBudgetStrangers: the table of sources without peers is
// bounded; beyond it a new source is refused, not tracked.
func TestSourceBudgetStrangers(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	b := newSourceBudget(func() time.Time { return now })
	b.lastSweep = now
	for i := range budgetMaxStrangers {
		if !b.Allow(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})) {
			t.Fatalf("source %d refused below the bound", i)
		}
	}
	if b.Allow(netip.MustParseAddr("192.0.2.1")) {
		t.Error("a source beyond the bound was admitted")
	}
	if len(b.sources) != budgetMaxStrangers {
		t.Errorf("%d sources tracked, want %d", len(b.sources), budgetMaxStrangers)
	}
}
