// SPDX-License-Identifier: MIT

package control

import (
	"math"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Failure limiting: each source network (an IPv4 address or an IPv6 /64)
// has a token bucket of failed attempts. A failure (bad request, bad token,
// unknown lease) takes a token; while the bucket has less than one token
// left, every request from that network is refused up front, before the
// token or lease secret is looked at, so guessing is bounded by the refill
// rate. Full buckets carry no information and are swept away, which bounds
// the table by the number of recently failing networks.

// maxFailurePeers bounds the failure table. When it is full and nothing can
// be swept, an arbitrary entry is evicted.
const maxFailurePeers = 1 << 16

// sweepInterval is how often full buckets are removed.
const sweepInterval = time.Minute

// failureLimiter counts failures per key K: a source network
// (peerKey), or an attested uid. It is safe for concurrent use.
type failureLimiter[K comparable] struct {
	limit rate.Limit
	burst int

	mu        sync.Mutex
	peers     map[K]*rate.Limiter
	lastSweep time.Time
}

func newFailureLimiter[K comparable](limit rate.Limit, burst int) *failureLimiter[K] {
	return &failureLimiter[K]{limit: limit, burst: burst, peers: make(map[K]*rate.Limiter)}
}

// peerKey groups addr with the addresses one client likely controls.
func peerKey(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return netip.Prefix{}
	}
	return p
}

// limited reports whether requests of key k must be refused at now and,
// if so, how long until the next one is allowed.
func (f *failureLimiter[K]) limited(k K, now time.Time) (time.Duration, bool) {
	if f.limit == rate.Inf {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	lim := f.peers[k]
	if lim == nil {
		return 0, false
	}
	tokens := lim.TokensAt(now)
	if tokens >= 1 {
		return 0, false
	}
	if f.limit <= 0 {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration((1 - tokens) / float64(f.limit) * float64(time.Second)), true
}

// fail records a failed attempt of key at now, and reports whether it
// used up the key's last token (the key is limited from now on).
func (f *failureLimiter[K]) fail(key K, now time.Time) (nowLimited bool) {
	if f.limit == rate.Inf {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	lim := f.peers[key]
	if lim == nil {
		f.makeRoomLocked(now)
		lim = rate.NewLimiter(f.limit, f.burst)
		f.peers[key] = lim
	}
	lim.AllowN(now, 1)
	return lim.TokensAt(now) < 1
}

// makeRoomLocked sweeps full buckets once per sweepInterval, or at once
// if the table is full, and evicts an arbitrary entry if it stays full.
func (f *failureLimiter[K]) makeRoomLocked(now time.Time) {
	full := len(f.peers) >= maxFailurePeers
	if !full && now.Sub(f.lastSweep) < sweepInterval {
		return
	}
	f.lastSweep = now
	for k, lim := range f.peers {
		if lim.TokensAt(now) >= float64(f.burst) {
			delete(f.peers, k)
		}
	}
	if len(f.peers) >= maxFailurePeers {
		for k := range f.peers {
			delete(f.peers, k)
			break
		}
	}
}

// size returns the number of tracked networks, for tests.
func (f *failureLimiter[K]) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.peers)
}
