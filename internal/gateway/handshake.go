// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// handshakeTimeout is how long after its join a job's first WireGuard
// handshake may take before it counts as missing.
const handshakeTimeout = 30 * time.Second

// handshakePoll is how often pending first handshakes are looked up while
// there are any. WireGuard records the handshake's time itself, so the
// poll delays the observation, not the measurement. A look-up reads every
// peer of the device under its configuration lock, which joins need too:
// it runs on this tick only, never once per join (that made a join storm
// quadratic).
const handshakePoll = 500 * time.Millisecond

// handshakePollPeers is how many peers make the handshake look-up one
// poll interval longer: every 5 s with 10,000 jobs.
const handshakePollPeers = 1000

// handshakeWatch holds the joins whose first WireGuard handshake has not
// been seen yet. It is safe for concurrent use; the zero value is empty.
type handshakeWatch struct {
	mu      sync.Mutex
	pending map[wgkey.Key]time.Time // peer → when its lease was granted
}

func (h *handshakeWatch) init() {
	if h.pending == nil {
		h.pending = make(map[wgkey.Key]time.Time)
	}
}

// add starts waiting for pub's first handshake after at.
func (h *handshakeWatch) add(pub wgkey.Key, at time.Time) {
	h.mu.Lock()
	h.init()
	h.pending[pub] = at
	h.mu.Unlock()
}

// forget stops waiting for pub (its lease ended without a peer).
func (h *handshakeWatch) forget(pub wgkey.Key) {
	h.mu.Lock()
	delete(h.pending, pub)
	h.mu.Unlock()
}

// handshakeLoop measures each job's first WireGuard handshake after its
// join (airlock_wireguard_first_handshake_seconds), and counts joins
// without one within handshakeTimeout, until ctx is done.
func (g *gateway) handshakeLoop(ctx context.Context) {
	t := time.NewTimer(handshakePoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// The look-up reads every peer: with many, look less often (the
		// times measured do not change, only when they are seen).
		t.Reset(handshakePoll * time.Duration(1+g.leases.Len()/handshakePollPeers))
		g.handshakes.mu.Lock()
		n := len(g.handshakes.pending)
		g.handshakes.mu.Unlock()
		if n == 0 {
			continue
		}
		hs, err := g.wg.Handshakes()
		if err != nil {
			g.log.Debug("read wireguard handshakes", "err", err)
			continue
		}
		now := time.Now()
		g.handshakes.mu.Lock()
		for k, at := range g.handshakes.pending {
			if h, ok := hs[k]; ok && !h.Before(at) {
				g.metrics.ObserveHandshake(h.Sub(at))
				delete(g.handshakes.pending, k)
			} else if now.Sub(at) > handshakeTimeout {
				g.metrics.HandshakeMissing()
				delete(g.handshakes.pending, k)
			}
		}
		g.handshakes.mu.Unlock()
	}
}

// removePeer removes a job's WireGuard peer. A job that ends before the
// handshake loop saw its first handshake (a job shorter than a poll) is
// measured now, while WireGuard still knows the peer.
func (g *gateway) removePeer(pub wgkey.Key) {
	g.handshakes.mu.Lock()
	at, pending := g.handshakes.pending[pub]
	delete(g.handshakes.pending, pub)
	g.handshakes.mu.Unlock()
	if pending && g.metrics != nil {
		if hs, err := g.wg.Handshakes(); err == nil {
			if h, ok := hs[pub]; ok && !h.Before(at) {
				g.metrics.ObserveHandshake(h.Sub(at))
			}
		}
	}
	g.wg.RemovePeer(pub)
}
