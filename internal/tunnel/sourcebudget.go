// SPDX-License-Identifier: MIT

package tunnel

import (
	"net/netip"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// The handshake budget of a source address under load. wireguard-go, when
// more handshakes are queued than it can work through, answers each with a
// cookie and then admits 20 a second from any one source address (bursts
// of 5). A compute node's jobs all come from the node's address (or a
// site's NAT): 10,000 jobs that rekey together, after an idle spell or
// when the gateway comes under load for any reason, then wait minutes for
// that one address's 20 a second, and the retries keep the gateway under
// load. Here a source's budget grows with the peers known to be behind
// it: 20 a second plus one every 2 s for each, bursts of 5 plus one for
// each, so that every job behind a source can handshake at once and then
// again every 2 s. A source with no peer keeps upstream's budget.
//
// Only messages that passed the cookie round come here, so the source
// address is not spoofed: an outside host cannot spend a node's budget.
// A peer is counted behind the address of its last authenticated packet,
// or, before it has one, behind the address its job joined from. Whoever
// holds leases from a source can spend that source's budget, as upstream
// (one hostile job on a node can spend the node's 20 a second there);
// what it can spend grows only with the leases behind the source, each of
// which took a valid join.
const (
	budgetBaseRate     = 20  // handshakes a second for any source (upstream's)
	budgetBaseBurst    = 5   // upstream's
	budgetPeerRate     = 0.5 // more a second for each peer behind the source
	budgetPeerBurst    = 1   // more burst for each peer behind the source
	budgetSweepEvery   = 10 * time.Second
	budgetMaxStrangers = 1 << 16 // sources with no peer tracked at once
)

// sourceBudget is a per-source handshake limiter
// (device.HandshakeLimiter). It is safe for concurrent use.
type sourceBudget struct {
	now func() time.Time

	mu        sync.Mutex
	sources   map[netip.Addr]*budgetEntry
	peerAt    map[wgkey.Key]netip.Addr
	strangers int // entries without peers
	lastSweep time.Time
}

// budgetEntry is one source's token bucket. x/time/rate's Limiter cannot
// be given tokens, which a peer's arrival does here.
type budgetEntry struct {
	peers  int
	tokens float64
	last   time.Time
}

func newSourceBudget(now func() time.Time) *sourceBudget {
	return &sourceBudget{
		now:     now,
		sources: make(map[netip.Addr]*budgetEntry),
		peerAt:  make(map[wgkey.Key]netip.Addr),
	}
}

// budgetOf is the rate (a second) and burst of a source with peers behind it.
func budgetOf(peers int) (float64, float64) {
	return budgetBaseRate + budgetPeerRate*float64(peers), budgetBaseBurst + budgetPeerBurst*float64(peers)
}

// refill brings e's tokens up to now.
func (e *budgetEntry) refill(now time.Time) {
	r, burst := budgetOf(e.peers)
	if dt := now.Sub(e.last).Seconds(); dt > 0 {
		e.tokens = min(burst, e.tokens+dt*r)
	}
	e.last = now
}

// full reports whether e's bucket is full at now.
func (e *budgetEntry) full(now time.Time) bool {
	e.refill(now)
	_, burst := budgetOf(e.peers)
	return e.tokens >= burst
}

// Allow implements device.HandshakeLimiter.
func (b *sourceBudget) Allow(ip netip.Addr) bool {
	ip = ip.Unmap()
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sweepLocked(now)
	e := b.sources[ip]
	if e == nil {
		if b.strangers >= budgetMaxStrangers {
			return false
		}
		e = b.entryLocked(ip, now)
	}
	e.refill(now)
	if e.tokens < 1 {
		return false
	}
	e.tokens--
	return true
}

// entryLocked makes ip's entry, without peers, with a full bucket.
func (b *sourceBudget) entryLocked(ip netip.Addr, now time.Time) *budgetEntry {
	_, burst := budgetOf(0)
	e := &budgetEntry{tokens: burst, last: now}
	b.sources[ip] = e
	b.strangers++
	return e
}

// place counts peer pub, new or known, behind ip (invalid: behind none
// yet).
func (b *sourceBudget) place(pub wgkey.Key, ip netip.Addr) { b.set(pub, ip, true) }

// move counts peer pub behind ip if pub is a peer (placed and not
// forgotten): a peer removed meanwhile is not brought back.
func (b *sourceBudget) move(pub wgkey.Key, ip netip.Addr) { b.set(pub, ip, false) }

// forget stops counting peer pub.
func (b *sourceBudget) forget(pub wgkey.Key) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.peerAt[pub]; ok {
		if old.IsValid() {
			b.adjustLocked(old, -1, now)
		}
		delete(b.peerAt, pub)
	}
}

func (b *sourceBudget) set(pub wgkey.Key, ip netip.Addr, add bool) {
	ip = ip.Unmap()
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	old, had := b.peerAt[pub]
	if (!had && !add) || (had && old == ip) {
		return
	}
	if had && old.IsValid() {
		b.adjustLocked(old, -1, now)
	}
	b.peerAt[pub] = ip
	if ip.IsValid() {
		b.adjustLocked(ip, +1, now)
	}
}

// adjustLocked changes the peers behind ip by d (±1): an arriving peer
// brings its burst with it, a leaving one takes its share of the
// ceiling.
func (b *sourceBudget) adjustLocked(ip netip.Addr, d int, now time.Time) {
	e := b.sources[ip]
	if e == nil {
		e = b.entryLocked(ip, now)
	}
	e.refill(now)
	if e.peers == 0 {
		b.strangers--
	}
	e.peers += d
	if e.peers == 0 {
		b.strangers++
	}
	_, burst := budgetOf(e.peers)
	if d > 0 {
		e.tokens += budgetPeerBurst * float64(d)
	}
	e.tokens = min(e.tokens, burst)
}

// sweepLocked drops, now and then, the entries of sources with no peer
// whose bucket is full again: they carry nothing.
func (b *sourceBudget) sweepLocked(now time.Time) {
	if now.Sub(b.lastSweep) < budgetSweepEvery {
		return
	}
	b.lastSweep = now
	for ip, e := range b.sources {
		if e.peers == 0 && e.full(now) {
			delete(b.sources, ip)
			b.strangers--
		}
	}
}

// peersBehind reports how many peers are counted behind ip.
func (b *sourceBudget) peersBehind(ip netip.Addr) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.sources[ip.Unmap()]; e != nil {
		return e.peers
	}
	return 0
}
