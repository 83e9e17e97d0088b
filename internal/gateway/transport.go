// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// transportState is the gateway's part of the TCP transport, the lease
// watches, the load report and draining. It is safe for concurrent use.
type transportState struct {
	bind     *tunnel.Bind
	instance string
	draining atomic.Bool
	// rxRate and txRate are math.Float64bits of bits per second.
	rxRate, txRate atomic.Uint64

	mu      sync.Mutex
	streams map[string]*tunnel.StreamEndpoint // guarded by mu: lease id → its TCP transport stream
}

func newTransportState(bind *tunnel.Bind) (*transportState, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("instance id: %w", err)
	}
	return &transportState{bind: bind, instance: hex.EncodeToString(b[:]), streams: map[string]*tunnel.StreamEndpoint{}}, nil
}

// loadSample is how often the traffic rate of the load report is sampled.
const loadSample = 2 * time.Second

// loadLoop samples the WireGuard traffic for the load report.
func (g *gateway) loadLoop(ctx context.Context) {
	t := time.NewTicker(loadSample)
	defer t.Stop()
	lastRx, lastTx := g.tr.bind.Bytes()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			rx, tx := g.tr.bind.Bytes()
			d := now.Sub(last).Seconds()
			if d > 0 {
				g.tr.rxRate.Store(math.Float64bits(float64(rx-lastRx) * 8 / d))
				g.tr.txRate.Store(math.Float64bits(float64(tx-lastTx) * 8 / d))
			}
			lastRx, lastTx, last = rx, tx, now
		}
	}
}

// health is the load report (Backend.Health).
func (g *gateway) health() control.Health {
	return control.Health{
		Jobs:         g.leases.Len(),
		Capacity:     g.egress.capacity.Jobs,
		Draining:     g.tr.draining.Load(),
		RxBitsPerSec: math.Float64frombits(g.tr.rxRate.Load()),
		TxBitsPerSec: math.Float64frombits(g.tr.txRate.Load()),
		Instance:     g.tr.instance,
		Attest:       g.admit.attest.mode(),
		Bearer:       g.admit.bearer.on(),
	}
}

// Tunnel attaches a client's TCP transport stream (control.Backend).
func (g *gateway) Tunnel(ctx context.Context, ref control.LeaseRef, remote netip.AddrPort) (func(net.Conn), error) {
	l, err := g.leases.Check(ref.ID, ref.Secret, time.Now())
	if err != nil {
		return nil, g.admin.leaseGone(ref.ID, err)
	}
	return func(c net.Conn) {
		s := g.tr.bind.AddStream(c, remote, l.ID)
		g.tr.mu.Lock()
		old := g.tr.streams[l.ID]
		g.tr.streams[l.ID] = s
		g.tr.mu.Unlock()
		if old != nil {
			old.Close()
		}
		g.log.Info("job uses the TCP transport", "lease", l.ID, "addrs", l.Addrs, "remote", remote, "replaced_stream", old != nil)
		go func() {
			<-s.Done()
			g.tr.mu.Lock()
			if g.tr.streams[l.ID] == s {
				delete(g.tr.streams, l.ID)
			}
			g.tr.mu.Unlock()
		}()
	}, nil
}

// CheckLease reports whether ref names a live lease (control.Backend).
func (g *gateway) CheckLease(ref control.LeaseRef) error {
	l, err := g.leases.Check(ref.ID, ref.Secret, time.Now())
	if err != nil {
		return g.admin.leaseGone(ref.ID, err)
	}
	return g.checkFrom(l, ref.From)
}

// transportOf says how lease id's WireGuard reaches the gateway: "tcp"
// while it has a TCP transport stream, else "udp".
func (g *gateway) transportOf(id string) string {
	g.tr.mu.Lock()
	defer g.tr.mu.Unlock()
	if g.tr.streams[id] != nil {
		return "tcp"
	}
	return "udp"
}

// closeStream closes the TCP transport stream of l, if it has one.
func (g *gateway) closeStream(l lease.Lease) {
	g.tr.mu.Lock()
	s := g.tr.streams[l.ID]
	delete(g.tr.streams, l.ID)
	g.tr.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// registerTransportMetrics adds the transport's series to reg (listed in
// docs/metrics.md).
func (g *gateway) registerTransportMetrics(reg prometheus.Registerer) error {
	streams := func() float64 {
		g.tr.mu.Lock()
		defer g.tr.mu.Unlock()
		return float64(len(g.tr.streams))
	}
	draining := func() float64 {
		if g.tr.draining.Load() {
			return 1
		}
		return 0
	}
	sessions := func() float64 {
		if g.res.srv == nil {
			return 0
		}
		return float64(g.res.srv.Sessions())
	}
	rx := func() float64 { r, _ := g.tr.bind.Bytes(); return float64(r) }
	tx := func() float64 { _, t := g.tr.bind.Bytes(); return float64(t) }
	queueDrops := func() float64 {
		if g.wg == nil {
			return 0
		}
		return float64(g.wg.QueueDrops())
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_tcp_transport_streams",
			Help: "Jobs whose WireGuard runs over the TCP/TLS transport (stream on the control port) now."}, streams),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_control_sessions",
			Help: "Open lease sessions: jobs holding their lease over one control connection (clients older than sessions use a lease watch instead)."}, sessions),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_draining",
			Help: "1 while the gateway drains (airlock gateway drain): new joins refused."}, draining),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "airlock_wireguard_received_bytes_total",
			Help: "WireGuard bytes received from jobs, UDP and TCP transport together."}, rx),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "airlock_wireguard_sent_bytes_total",
			Help: "WireGuard bytes sent to jobs, UDP and TCP transport together."}, tx),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "airlock_wireguard_queue_drops_total",
			Help: "Packets to jobs dropped from their own queues at the gateway: CoDel (a job's backlog waited above 5 ms for 100 ms) or a job's queue limit."}, queueDrops),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register transport metrics: %w", err)
		}
	}
	return nil
}
