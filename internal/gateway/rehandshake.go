// SPDX-License-Identifier: MIT

package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/statefile"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// A restart without a herd. A restarted gateway has restored every live
// lease with its WireGuard peer (resume.go) but has lost the sessions:
// every job must handshake again. Left to the jobs, thousands do so within
// a second of seeing the new instance, all from the few addresses of their
// compute nodes; wireguard-go then counts itself under load and answers
// each with a cookie first, so every job's handshake waits for its 5-s
// retry, and the handshakes a second a source address may start are
// bounded (upstream: 20; internal/tunnel's budget: more with the jobs
// behind it).
//
// So the gateway starts the handshakes itself. While it runs it keeps each
// peer's last UDP endpoint in DIR/endpoints (written every
// endpointSaveEvery when something changed, and at a clean stop); at the
// next start each restored peer gets its endpoint back, and rehandshakeLoop
// initiates the handshakes at rehandshakeRate a second: the answers come
// back at the pace the gateway chose, and skip wireguard-go's cookie round
// even while it counts itself under load (third_party/wireguard-go). The first event of each job's control session says
// how long the gateway may take to reach it (control.WatchEvent.Resume,
// from HandshakeDue), and the client waits that long for the gateway's
// handshake before it starts one itself. Jobs on the TCP transport, and
// jobs whose endpoint the gateway did not know (joined less than
// endpointSaveEvery before a crash), handshake as before.

// EndpointsFile is the file in the state directory that keeps the peers'
// last UDP endpoints across restarts: one "PUBLICKEY HOST:PORT" line each.
const EndpointsFile = "endpoints"

const (
	// endpointSaveEvery is how often the endpoints are saved when they
	// changed: a crash loses at most this much of them.
	endpointSaveEvery = 15 * time.Second
	// rehandshakeRate is how many handshakes a second a restarted gateway
	// starts: 2,000 jobs in 2 s, 10,000 in 10 s. Each answer costs the
	// gateway two X25519 multiplications (about 0.1 ms), so this is a
	// tenth of a core.
	rehandshakeRate = 1000
	// rehandshakeSlack is added to the pacer's estimate in what the jobs
	// are told to wait.
	rehandshakeSlack = 3 * time.Second
)

// rehandshakes is the restored peers' handshake state. It is safe for
// concurrent use; the zero value is ready.
type rehandshakes struct {
	mu sync.Mutex
	// saved are the endpoints of the previous run, then as last written.
	saved map[wgkey.Key]netip.AddrPort
	// pending are restored peers with an endpoint whose handshake the
	// gateway has not started yet; done is when the pacer expects to
	// have started all of them.
	pending map[wgkey.Key]bool
	done    time.Time
}

// readEndpoints reads the endpoints file of dir; a missing file is empty,
// and bad lines are skipped.
func readEndpoints(dir string) (map[wgkey.Key]netip.AddrPort, error) {
	out := map[wgkey.Key]netip.AddrPort{}
	b, err := os.ReadFile(filepath.Join(dir, EndpointsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read wireguard endpoints: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		pub, err1 := wgkey.Parse(k)
		ep, err2 := netip.ParseAddrPort(v)
		if err1 == nil && err2 == nil {
			out[pub] = ep
		}
	}
	return out, nil
}

// writeEndpoints replaces dir's endpoints file with eps (mode 0600).
func writeEndpoints(dir string, eps map[wgkey.Key]netip.AddrPort) error {
	lines := make([]string, 0, len(eps))
	for k, ep := range eps {
		lines = append(lines, k.String()+" "+ep.String()+"\n")
	}
	sort.Strings(lines)
	return statefile.WriteAtomic(filepath.Join(dir, EndpointsFile), []byte(strings.Join(lines, "")), 0o600)
}

// loadEndpoints reads the previous run's endpoints, for restore.
func (g *gateway) loadEndpoints() {
	eps, err := readEndpoints(g.cfg.StateDir)
	if err != nil {
		g.log.Warn("restored jobs will start their handshakes themselves", "err", err)
	}
	g.rehs.mu.Lock()
	g.rehs.saved = eps
	g.rehs.mu.Unlock()
}

// restoreEndpoint gives restored peer pub its endpoint of the previous run,
// if known, and queues the gateway's handshake with it.
func (g *gateway) restoreEndpoint(pub wgkey.Key) {
	g.rehs.mu.Lock()
	ep, ok := g.rehs.saved[pub]
	g.rehs.mu.Unlock()
	if !ok {
		return
	}
	if err := g.wg.SetEndpoint(pub, ep); err != nil {
		g.log.Debug("restored peer keeps no endpoint", "key", pub, "err", err)
		return
	}
	g.rehs.mu.Lock()
	if g.rehs.pending == nil {
		g.rehs.pending = map[wgkey.Key]bool{}
	}
	g.rehs.pending[pub] = true
	g.rehs.done = time.Now().Add(time.Duration(len(g.rehs.pending)) * time.Second / rehandshakeRate)
	g.rehs.mu.Unlock()
}

// HandshakeDue implements control.Backend: how long the gateway may still
// take to start the handshake with the job of lease ref itself (0: it
// will not).
func (g *gateway) HandshakeDue(ref control.LeaseRef) time.Duration {
	l, err := g.leases.Check(ref.ID, ref.Secret, time.Now())
	if err != nil {
		return 0
	}
	g.rehs.mu.Lock()
	defer g.rehs.mu.Unlock()
	if !g.rehs.pending[l.PublicKey] {
		return 0
	}
	return max(time.Until(g.rehs.done), 0) + rehandshakeSlack
}

// rehandshakeLoop starts the handshakes with the restored peers, paced
// (see the theory of operation above); it ends when all are started.
func (g *gateway) rehandshakeLoop(ctx context.Context) {
	g.rehs.mu.Lock()
	keys := make([]wgkey.Key, 0, len(g.rehs.pending))
	for k := range g.rehs.pending {
		keys = append(keys, k)
	}
	g.rehs.mu.Unlock()
	if len(keys) == 0 {
		return
	}
	t0 := time.Now()
	const batch = rehandshakeRate / 20 // every 50 ms
	tick := time.NewTicker(time.Second * batch / rehandshakeRate)
	defer tick.Stop()
	started, failed, underLoad := 0, 0, 0
	for len(keys) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// No pause while wireguard-go counts itself under load: the
		// answers to these initiations skip its cookie round (the fork's
		// exemption), and 10,000 jobs re-establishing their sessions keep
		// it under load for most of a restart, so pausing held the last
		// jobs for 50 s (docs/benchmarks/history-2026-11-28.md).
		if g.wg.UnderLoad() {
			underLoad++
		}
		n := min(batch, len(keys))
		for _, k := range keys[:n] {
			if err := g.wg.Initiate(k); err != nil {
				failed++ // the lease ended meanwhile
			} else {
				started++
			}
		}
		g.rehs.mu.Lock()
		for _, k := range keys[:n] {
			delete(g.rehs.pending, k)
		}
		g.rehs.done = time.Now().Add(time.Duration(len(g.rehs.pending)) * time.Second / rehandshakeRate)
		g.rehs.mu.Unlock()
		keys = keys[n:]
	}
	g.log.Info("handshakes with the restored jobs started", "jobs", started, "gone", failed,
		"took", time.Since(t0).Round(time.Millisecond), "batches_under_load", underLoad)
}

// endpointLoop saves the peers' endpoints every endpointSaveEvery when
// they changed, and once more when ctx ends.
func (g *gateway) endpointLoop(ctx context.Context) {
	t := time.NewTicker(endpointSaveEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.saveEndpoints()
			return
		case <-t.C:
			g.saveEndpoints()
		}
	}
}

// saveEndpoints writes the UDP endpoints of the live leases' peers, if
// they differ from what was written last.
func (g *gateway) saveEndpoints() {
	peers, err := g.wg.Peers()
	if err != nil {
		g.log.Debug("save wireguard endpoints", "err", err)
		return
	}
	eps := make(map[wgkey.Key]netip.AddrPort, len(peers))
	for k, p := range peers {
		if p.Endpoint.IsValid() {
			eps[k] = p.Endpoint
		}
	}
	g.rehs.mu.Lock()
	same := maps.Equal(eps, g.rehs.saved)
	g.rehs.mu.Unlock()
	if same {
		return
	}
	if err := writeEndpoints(g.cfg.StateDir, eps); err != nil {
		g.log.Warn("cannot save the jobs' WireGuard endpoints: after a restart they will start their handshakes themselves", "err", err)
		return
	}
	g.rehs.mu.Lock()
	g.rehs.saved = eps
	g.rehs.mu.Unlock()
}
