// SPDX-License-Identifier: MIT

package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/bypass"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"golang.zx2c4.com/wireguard/tun"
)

// Session theory of operation: a session is the client's hold on one
// gateway out of the configured ones: its lease, its WireGuard peer and the
// transport that carries it. Run joins through it before the job's
// namespace exists, then hands it the job's TUN and starts supervise in
// the background while the job runs.
//
// supervise first picks the transport (auto: UDP if a handshake completes
// within TransportTimeout, else the TCP/TLS stream on the control port),
// then keeps a lease watch open on the gateway. The watch ends at once when
// the gateway process stops and within three heartbeats (15 s) when the
// network fails silently, and that silence counts towards the failover
// threshold; a renewal that finds the lease unknown also ends it. Then the job keeps
// running and the session reconnects with backoff (250 ms doubling to 2 s):
// a gateway that comes back with a new instance id (it restarted and
// restored the lease from its state) gets a fresh handshake, so new
// connections work again within about a second; a lease the gateway no
// longer knows is joined again with the same key. With several gateways, a
// gateway lost for FailoverAfter is given up: the session joins the least
// loaded other one. Whenever the lease address differs from the one the
// job's namespace was made with, a tunnel.Readdress decorator on the TUN
// translates between the two, so the job never needs reconfiguring.

// Defaults of the transport and reconnect settings.
const (
	DefaultTransportTimeout = 3 * time.Second
	DefaultFailoverAfter    = 10 * time.Second
	backoffMin              = 250 * time.Millisecond
	backoffMax              = 2 * time.Second
	healthTimeout           = 3 * time.Second
)

// Transports of Config.Transport.
const (
	TransportAuto = "auto"
	TransportUDP  = "udp"
	TransportTCP  = "tcp"
)

// gatewayEntry is one configured gateway.
type gatewayEntry struct {
	addr string
	cc   *control.Client
	// checks is what the gateway's last load report said it checks
	// ("munge", or "none"; "" before any report), for attest.go.
	checks string
	// last is the lease this session last held at this gateway, if any:
	// a join there again proves it (JoinRequest.Replace), should the
	// gateway still hold it after a failover away and back.
	last *control.LeaseRef
}

// session is the client's connection to its current gateway. Its fields
// are owned by the goroutine that runs supervise once the job runs; before
// and after that, by Run.
type session struct {
	// att makes the joins' MUNGE credentials (attest.go); nil: none.
	att       *nodeAttest
	log       *slog.Logger
	stderr    io.Writer // the user's: loud messages when the lease is gone for good
	gws       []*gatewayEntry
	priv      wgkey.Key
	req       control.JoinRequest
	transport string // configured: auto, udp or tcp
	wait      time.Duration
	failover  time.Duration
	warnAfter time.Duration // with udp or tcp forced: when to warn about no handshake
	// bypass is the site-local bypass the gateway sent (lease and
	// watch); its counters go with every renewal.
	bypass *bypass.Engine
	// bypassBase are its counters when the current lease began: reports
	// are per lease.
	bypassBase []control.BypassCount

	cur      *gatewayEntry
	lease    control.Lease
	endpoint netip.AddrPort
	instance string // the gateway instance last seen by a watch

	// jobAddrs and jobDNS are the job's tunnel addresses and resolvers
	// as its namespace was configured (both families).
	jobAddrs, jobDNS []netip.Addr
	rd               *tunnel.Readdress
	bind             *tunnel.Bind
	wg               *tunnel.Client
	using            string // transport in use: udp or tcp
	// egressDir holds the job's egress file (egressfile.go).
	egressDir string

	relMu sync.Mutex
	rel   struct { // guarded by relMu: the lease to release at exit
		cc  *control.Client
		ref control.LeaseRef
	}
}

// parseGateways is ParseGateways for a session.
func parseGateways(gateways, pins string, timeout time.Duration) ([]*gatewayEntry, error) {
	gws, err := ParseGateways(gateways, pins, timeout)
	if err != nil {
		return nil, err
	}
	out := make([]*gatewayEntry, len(gws))
	for i, g := range gws {
		out[i] = &gatewayEntry{addr: g.Addr, cc: g.CC}
	}
	return out, nil
}

// ranked is a gateway with its load report, for ordering.
type ranked struct {
	gw     *gatewayEntry
	health control.Health
}

// rank is Rank over the session's gateways.
func (s *session) rank(ctx context.Context, skip *gatewayEntry) []ranked {
	gws := make([]Gateway, len(s.gws))
	si := -1
	for i, g := range s.gws {
		gws[i] = Gateway{Addr: g.addr, CC: g.cc}
		if g == skip {
			si = i
		}
	}
	var out []ranked
	for _, r := range Rank(ctx, s.log, gws, si) {
		out = append(out, ranked{gw: s.gws[r.Index], health: r.Health})
	}
	return out
}

// join joins the least loaded gateway but skip, trying the others in order
// when one refuses. It sets s.cur, s.lease and s.endpoint.
func (s *session) join(ctx context.Context, skip *gatewayEntry, timeout time.Duration) error {
	rs := s.rank(ctx, skip)
	if len(rs) == 0 {
		return fmt.Errorf("no gateway to join: every gateway is unreachable or draining (%s)", s.gatewayList())
	}
	var errs []error
	for _, r := range rs {
		if r.health != (control.Health{}) {
			r.gw.checks = cmp.Or(r.health.Attest, "none")
		}
		req := s.req
		req.Replace = r.gw.last
		ls, err := s.signedJoin(ctx, r.gw, req, timeout)
		if errors.Is(err, control.ErrKeyInUse) {
			if req, err = s.newKey(r.gw, err); err == nil {
				ls, err = s.signedJoin(ctx, r.gw, req, timeout)
			}
		}
		var ep netip.AddrPort
		if err == nil {
			jctx, cancel := context.WithTimeout(ctx, timeout)
			ep, err = resolveEndpoint(jctx, ls.Endpoint, r.gw.addr)
			cancel()
		}
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if len(s.gws) == 1 {
				return err
			}
			s.log.Warn("join refused; trying the next gateway", "gateway", r.gw.addr, "err", err)
			errs = append(errs, err)
			continue
		}
		if len(s.gws) > 1 {
			s.log.Info("joined the least loaded gateway", "gateway", r.gw.addr, "jobs", r.health.Jobs,
				"bits_per_sec", int64(r.health.RxBitsPerSec+r.health.TxBitsPerSec), "of", s.gatewayList())
		}
		s.cur, s.lease, s.endpoint = r.gw, ls, ep
		s.log.Info("joined", "gateway", r.gw.addr, "lease", ls.ID, "gateway_version", ls.GatewayVersion, "version", s.req.Version)
		r.gw.last = &control.LeaseRef{ID: ls.ID, Secret: ls.Secret}
		s.learnMembers(ls.Members, timeout)
		s.writeEgressFile()
		s.setBypass(ls.Bypass)
		s.bypassBase = s.bypass.Report()
		s.relMu.Lock()
		s.rel.cc, s.rel.ref = r.gw.cc, control.LeaseRef{ID: ls.ID, Secret: ls.Secret}
		s.relMu.Unlock()
		return nil
	}
	return fmt.Errorf("no gateway took the job: %w", errors.Join(errs...))
}

// signedJoin is joinOne with the join's MUNGE credentials, if the
// session makes them for gw.
func (s *session) signedJoin(ctx context.Context, gw *gatewayEntry, req control.JoinRequest, timeout time.Duration) (control.Lease, error) {
	req, err := s.att.sign(ctx, s, gw, req)
	if err != nil {
		return control.Lease{}, err
	}
	ls, err := s.joinOne(ctx, gw, req, timeout)
	s.att.spent(req, err)
	return ls, err
}

// rateLimitBudget bounds how long joinOne waits out a gateway's rate
// limit on this node's address (which a neighbour's failed requests can
// trigger) before it gives the refusal to the caller.
const rateLimitBudget = 30 * time.Second

// joinOne joins gw, each attempt within timeout. A 429 (the gateway limits
// failed requests from this node's address) is waited out for the
// Retry-After the gateway names (1–5 s), for at most rateLimitBudget in
// all, with a warning; every other error returns at once.
func (s *session) joinOne(ctx context.Context, gw *gatewayEntry, req control.JoinRequest, timeout time.Duration) (control.Lease, error) {
	deadline := time.Now().Add(rateLimitBudget)
	for {
		jctx, cancel := context.WithTimeout(ctx, timeout)
		ls, err := gw.cc.Join(jctx, req)
		cancel()
		var ae *control.APIError
		if err == nil || !errors.Is(err, control.ErrRateLimited) || !errors.As(err, &ae) {
			return ls, err
		}
		wait := min(max(ae.RetryAfter, time.Second), 5*time.Second)
		if time.Now().Add(wait).After(deadline) {
			return ls, err
		}
		s.log.Warn("the gateway rate-limits joins from this node's address (failed requests from it, maybe another process's); retrying",
			"gateway", gw.addr, "in", wait)
		select {
		case <-ctx.Done():
			return ls, context.Cause(ctx)
		case <-time.After(wait):
		}
	}
}

// maxGateways bounds the gateways a session knows, whatever a fleet's
// member list says.
const maxGateways = 64

// learnMembers adds the fleet's gateways that a lease names (and that
// the session does not know by address) to the session's list, so that a
// job given one gateway of a fleet fails over to the others. Their pins
// come from a gateway this client pinned.
func (s *session) learnMembers(ms []control.Member, timeout time.Duration) {
	known := map[string]bool{}
	for _, g := range s.gws {
		known[g.addr] = true
	}
	added := 0
	for _, m := range ms {
		if known[m.Gateway] || len(s.gws) >= maxGateways {
			continue
		}
		pin, err := control.ParsePin(m.Pin)
		if err != nil {
			s.log.Warn("fleet member with a bad pin left out", "gateway", m.Gateway, "err", err)
			continue
		}
		cc, err := control.NewClient(m.Gateway, pin, timeout)
		if err != nil {
			s.log.Warn("fleet member left out", "gateway", m.Gateway, "err", err)
			continue
		}
		known[m.Gateway] = true
		s.gws = append(s.gws, &gatewayEntry{addr: m.Gateway, cc: cc})
		added++
	}
	if added > 0 {
		s.log.Info("learned the fleet's gateways from the lease: failover goes to them", "added", added, "gateways", s.gatewayList())
	}
}

func (s *session) gatewayList() string {
	var a []string
	for _, g := range s.gws {
		a = append(a, g.addr)
	}
	return strings.Join(a, ",")
}

func (s *session) ref() control.LeaseRef {
	return control.LeaseRef{ID: s.lease.ID, Secret: s.lease.Secret}
}

// release gives the current lease back; Run calls it at exit.
func (s *session) release(log *slog.Logger) {
	s.relMu.Lock()
	cc, ref := s.rel.cc, s.rel.ref
	s.relMu.Unlock()
	if cc == nil {
		return
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer rcancel()
	if rep := s.bypassReport(); len(rep) > 0 {
		// The last counters, so the gateway's totals are complete.
		if _, err := cc.RenewReport(rctx, control.RenewRequest{LeaseRef: ref, Bypass: rep}); err != nil {
			log.Debug("final bypass report", "lease", ref.ID, "err", err)
		}
	}
	if err := cc.Release(rctx, ref); err != nil {
		log.Warn("release lease", "lease", ref.ID, "err", err)
	}
}

// closeClients closes every control client's idle connections.
func (s *session) closeClients() {
	for _, g := range s.gws {
		g.cc.Close()
	}
}

// startTunnel starts WireGuard on the job's TUN towards the current
// gateway. With --transport tcp the stream is opened at once.
func (s *session) startTunnel(ctx context.Context, dev tun.Device) error {
	gwKey := s.lease.GatewayPublicKey // validated by control.Client.Join
	s.jobAddrs, s.jobDNS = addrsOf(s.lease.TunnelAddrs()), s.lease.DNS
	s.rd = tunnel.NewReaddress(dev)
	s.bind = tunnel.NewBind(nil, s.log.With("component", "transport"))
	var err error
	s.wg, err = tunnel.NewClient(s.log, s.rd, s.bind, s.priv, gwKey, s.endpoint)
	if err != nil {
		return err
	}
	s.using = TransportUDP
	if s.transport == TransportTCP {
		if err := s.dialStream(ctx); err != nil {
			s.wg.Close()
			return fmt.Errorf("--transport tcp: %w", err)
		}
		s.log.Info("transport: tcp (--transport tcp)", "gateway", s.cur.addr)
	}
	return nil
}

// dialStream opens the TCP transport to the current gateway and sends
// everything over it.
func (s *session) dialStream(ctx context.Context) error {
	c, remote, err := s.cur.cc.DialTunnel(ctx, s.ref())
	if err != nil {
		return err
	}
	if old := s.bind.Stream(); old != nil {
		old.Close()
	}
	s.bind.UseStream(s.bind.AddStream(c, remote, s.cur.addr))
	s.using = TransportTCP
	return nil
}

// selectTransport is the auto transport choice at start-up.
func (s *session) selectTransport(ctx context.Context) {
	if s.transport != TransportAuto {
		if !s.waitHandshake(ctx, s.warnAfter) && ctx.Err() == nil {
			s.log.Warn("no WireGuard handshake with the gateway yet; the job has no network until it completes",
				"gateway", s.cur.addr, "transport", s.using, "waited", s.warnAfter,
				"hint", "with --transport udp, UDP to the gateway may be blocked: try --transport auto")
		}
		return
	}
	t0 := time.Now()
	if s.waitHandshake(ctx, s.wait) {
		s.log.Info("transport: udp (WireGuard handshake completed)", "gateway", s.cur.addr, "took", time.Since(t0).Round(time.Millisecond))
		return
	}
	if ctx.Err() != nil {
		return
	}
	if err := s.dialStream(ctx); err != nil {
		s.log.Warn("no WireGuard handshake over UDP and the TCP transport failed too; the job has no network until one works",
			"gateway", s.cur.addr, "waited", s.wait, "err", err)
		return
	}
	s.log.Warn("transport: tcp: no WireGuard handshake over UDP, switched to TCP/TLS on the control port (is UDP to the gateway blocked?)",
		"gateway", s.cur.addr, "udp_endpoint", s.endpoint, "waited", s.wait)
	if !s.waitHandshake(ctx, HandshakeWarnAfter) && ctx.Err() == nil {
		s.log.Warn("no WireGuard handshake over TCP either; the job has no network until it completes", "gateway", s.cur.addr)
	}
}

// recheckTransport repeats the auto choice after a move to another
// gateway or lease while on UDP: UDP to the new gateway may be blocked
// where it was not to the old one.
func (s *session) recheckTransport(ctx context.Context) {
	if s.transport == TransportAuto && s.using == TransportUDP {
		s.selectTransport(ctx)
	}
}

// waitHandshake reports whether a handshake completes within d.
func (s *session) waitHandshake(ctx context.Context, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		if !s.wg.LastHandshake().IsZero() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return !s.wg.LastHandshake().IsZero()
		case <-poll.C:
		}
	}
}

// errStreamLost ends a watch when the TCP transport stream closed.
var errStreamLost = errors.New("TCP transport stream closed")

// supervise keeps the job connected until ctx ends; see the theory of
// operation above.
func (s *session) supervise(ctx context.Context) {
	s.selectTransport(ctx)
	var lostSince time.Time
	delay := backoffMin
	for ctx.Err() == nil {
		w, err := s.cur.cc.Watch(ctx, s.ref())
		var lastHeard time.Time
		if err == nil {
			err = s.connected(ctx, w, &lostSince)
			lastHeard = w.LastEvent()
			delay = backoffMin
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, control.ErrLeaseEnded) {
			s.leaseGone(err, "THE GATEWAY ENDED THIS JOB'S LEASE", "ask the gateway's admin why")
			return
		}
		if errors.Is(err, control.ErrUnknownLease) {
			jerr := s.rejoin(ctx)
			if jerr == nil {
				lostSince = time.Time{}
				continue
			}
			if fatalJoinError(jerr) {
				s.leaseGone(jerr, "THE GATEWAY NO LONGER KNOWS THIS JOB'S LEASE (expired while unreachable) AND REFUSES A NEW ONE",
					"check the token with the gateway's admin")
				return
			}
			err = jerr
		}
		if lostSince.IsZero() {
			lostSince = time.Now()
			if errors.Is(err, control.ErrWatchSilent) && !lastHeard.IsZero() {
				lostSince = lastHeard // silent since then: counts towards failover
			}
			s.log.Warn("lost the gateway; the job keeps running, reconnecting", "gateway", s.cur.addr, "err", err)
		} else {
			s.log.Debug("gateway still unreachable", "gateway", s.cur.addr, "err", err, "for", time.Since(lostSince).Round(time.Millisecond))
		}
		if len(s.gws) > 1 && time.Since(lostSince) >= s.failover {
			// The lost gateway's lease is not released: it cannot be
			// reached, and the lease expires there.
			if ferr := s.failTo(ctx, lostSince); ferr == nil {
				lostSince = time.Time{}
				continue
			} else {
				s.log.Warn("failover found no other gateway; still trying", "err", ferr)
			}
		}
		t := time.NewTimer(jitter(delay))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, backoffMax)
	}
}

// leaseGone tells the user, once and loudly on stderr, that the job lost
// its network for good, and why; supervise stops after it.
func (s *session) leaseGone(err error, what, hint string) {
	fmt.Fprintf(s.stderr, "airlock: %s: %s\n"+
		"airlock: the job keeps running, but its network through the gateway is cut; %s\n", what, apiMessage(err), hint)
	s.log.Error("lease gone; not reconnecting", "lease", s.lease.ID, "gateway", s.cur.addr, "err", err)
}

// fatalJoinError reports whether a join failed for a reason that retrying
// cannot fix (as opposed to an unreachable or busy gateway).
func fatalJoinError(err error) bool {
	return errors.Is(err, control.ErrBadToken) || errors.Is(err, control.ErrPinMismatch) ||
		errors.Is(err, control.ErrBadRequest) || errors.Is(err, control.ErrLeaseEnded) || errors.Is(err, control.ErrBanned) ||
		errors.Is(err, control.ErrVersionUnsupported) ||
		errors.Is(err, control.ErrAttestation) || errors.Is(err, control.ErrAttestationRequired)
}

func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(2*d/5)+1))
}

// connected runs while the watch w is open: it renews the lease and
// returns why the watch ended.
func (s *session) connected(ctx context.Context, w *control.Watch, lostSince *time.Time) error {
	defer w.Close()
	if w.First.Bypass != nil {
		s.setBypass(w.First.Bypass)
	}
	restarted := s.instance != "" && w.First.Instance != s.instance
	s.instance = w.First.Instance
	streamGone := s.using == TransportTCP && (s.bind.Stream() == nil || s.bind.Stream().Err() != nil)
	if restarted || streamGone || !lostSince.IsZero() {
		if err := s.reconnect(ctx); err != nil {
			return err
		}
	}
	if !lostSince.IsZero() {
		s.log.Warn("gateway back; the job's new connections work again", "gateway", s.cur.addr,
			"down_for", time.Since(*lostSince).Round(time.Millisecond), "gateway_restarted", restarted, "transport", s.using)
		*lostSince = time.Time{}
	} else if restarted {
		s.log.Warn("gateway restarted; tunnel re-established", "gateway", s.cur.addr, "transport", s.using)
	}

	ended := make(chan error, 1)
	go func() {
		for {
			ev, err := w.Next()
			if err != nil {
				ended <- err
				return
			}
			if ev.Bypass != nil {
				s.setBypass(ev.Bypass)
			}
		}
	}()
	var streamDone <-chan struct{}
	if st := s.bind.Stream(); st != nil {
		streamDone = st.Done()
	}
	every := time.Duration(s.lease.RenewInterval)
	if every <= 0 {
		every = 30 * time.Second
	}
	renew := time.NewTicker(every)
	defer renew.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-ended:
			return err
		case <-streamDone:
			return errStreamLost
		case <-renew.C:
			rctx, cancel := context.WithTimeout(ctx, every/2)
			_, err := s.cur.cc.RenewReport(rctx, control.RenewRequest{LeaseRef: s.ref(), Bypass: s.bypassReport()})
			cancel()
			if errors.Is(err, control.ErrUnknownLease) || errors.Is(err, control.ErrLeaseEnded) {
				return err
			}
			if err != nil {
				s.log.Warn("renew lease failed; will retry", "lease", s.lease.ID, "err", err)
			}
		}
	}
}

// reconnect gives the WireGuard peer fresh handshake state (the gateway
// restarted, or the path was down long enough for sessions to be lost)
// and, on the TCP transport, a new stream.
func (s *session) reconnect(ctx context.Context) error {
	if s.using == TransportTCP {
		if err := s.dialStream(ctx); err != nil {
			return err
		}
	}
	return s.wg.SetGateway(s.lease.GatewayPublicKey, s.endpoint)
}

// rejoin joins the current gateway again after it lost the lease.
func (s *session) rejoin(ctx context.Context) error {
	old := s.lease.Address.Addr()
	req := s.req
	if s.lease.ID != "" {
		// Proves the key's old lease is ours, should the gateway still
		// hold it.
		ref := s.ref()
		req.Replace = &ref
	}
	ls, err := s.signedRejoin(ctx, req)
	if errors.Is(err, control.ErrKeyInUse) {
		if req, err = s.newKey(s.cur, err); err == nil {
			ls, err = s.signedRejoin(ctx, req)
		}
	}
	if err != nil {
		return err
	}
	ep, err := resolveEndpoint(ctx, ls.Endpoint, s.cur.addr)
	if err != nil {
		return err
	}
	s.lease, s.endpoint, s.instance = ls, ep, ""
	s.cur.last = &control.LeaseRef{ID: ls.ID, Secret: ls.Secret}
	s.writeEgressFile()
	s.setBypass(ls.Bypass)
	s.bypassBase = s.bypass.Report()
	s.relMu.Lock()
	s.rel.ref = s.ref()
	s.relMu.Unlock()
	s.readdress()
	if err := s.reconnect(ctx); err != nil {
		return err
	}
	s.recheckTransport(ctx)
	s.log.Warn("the gateway had lost this job's lease; joined again", "gateway", s.cur.addr,
		"lease", ls.ID, "old_addr", old, "new_addrs", ls.TunnelAddrs(), "job_addrs", s.jobAddrs)
	return nil
}

// newKey gives the session a new WireGuard key after gw refused a join
// because another client holds the current one (inUse): someone who
// learnt the public key (it is not secret) joined with it while this
// job's lease was gone. It returns the join request to send with the new
// key, which has no lease to replace.
func (s *session) newKey(gw *gatewayEntry, inUse error) (control.JoinRequest, error) {
	priv, err := wgkey.Generate()
	if err != nil {
		return control.JoinRequest{}, fmt.Errorf("%w; and making a new key failed: %w", inUse, err)
	}
	if s.wg != nil {
		if err := s.wg.SetPrivateKey(priv); err != nil {
			return control.JoinRequest{}, fmt.Errorf("%w; and the new key: %w", inUse, err)
		}
	}
	s.log.Warn("the gateway says another client holds this job's WireGuard key; joining with a new key",
		"gateway", gw.addr, "old_key", s.priv.PublicKey(), "new_key", priv.PublicKey(), "err", inUse)
	s.priv = priv
	s.req.PublicKey = priv.PublicKey()
	for _, g := range s.gws {
		g.last = nil // leases of the old key
	}
	return s.req, nil
}

// signedRejoin sends a rejoin of the current gateway with its MUNGE
// credentials.
func (s *session) signedRejoin(ctx context.Context, req control.JoinRequest) (control.Lease, error) {
	req, err := s.att.sign(ctx, s, s.cur, req)
	if err != nil {
		return control.Lease{}, err
	}
	ls, err := s.cur.cc.Join(ctx, req)
	s.att.spent(req, err)
	return ls, err
}

// failTo moves the job to the least loaded other gateway.
func (s *session) failTo(ctx context.Context, lostSince time.Time) error {
	old := s.cur
	if err := s.join(ctx, old, 15*time.Second); err != nil {
		return err
	}
	s.instance = ""
	s.readdress()
	if err := s.reconnect(ctx); err != nil {
		return err
	}
	s.recheckTransport(ctx)
	s.log.Warn("failed over to another gateway: the job's open connections are broken, new ones go through it",
		"from", old.addr, "to", s.cur.addr, "lost_for", time.Since(lostSince).Round(time.Millisecond),
		"lease_addrs", s.lease.TunnelAddrs(), "job_addrs", s.jobAddrs, "transport", s.using)
	return nil
}

// readdress points the TUN decorator at the current lease: the job keeps
// its addresses and resolvers of each family.
func (s *session) readdress() {
	s.rd.Set(s.jobAddrs, addrsOf(s.lease.TunnelAddrs()), s.jobDNS, s.lease.DNS)
}

// addrsOf returns the addresses of ps.
func addrsOf(ps []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, len(ps))
	for i, p := range ps {
		out[i] = p.Addr()
	}
	return out
}

// setBypass puts the gateway's site-local bypass in force; one that does
// not compile leaves the old one.
func (s *session) setBypass(b *control.Bypass) {
	if err := s.bypass.Update(b); err != nil {
		s.log.Warn("the gateway sent a site-local bypass this client cannot use; the old one stays in force", "err", err)
	}
}

// bypassReport returns the bypass counters of the current lease.
func (s *session) bypassReport() []control.BypassCount {
	cur := s.bypass.Report()
	if len(s.bypassBase) == 0 {
		return cur
	}
	base := make(map[string]control.BypassCount, len(s.bypassBase))
	for _, b := range s.bypassBase {
		base[b.Rule] = b
	}
	for i, c := range cur {
		b := base[c.Rule]
		cur[i] = control.BypassCount{Rule: c.Rule, Flows: c.Flows - b.Flows, BytesOut: c.BytesOut - b.BytesOut, BytesIn: c.BytesIn - b.BytesIn}
	}
	return cur
}
