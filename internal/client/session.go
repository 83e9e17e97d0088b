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
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/bypass"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/siteproxy"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"golang.zx2c4.com/wireguard/tun"
)

// Session theory of operation: a session is the client's hold on one
// gateway out of the configured ones: its lease, its WireGuard peer and the
// transport that carries it. Run joins through it before the job's
// namespace exists, then hands it the job's TUN and starts Supervise in
// the background while the job runs. The load generator (test/loadgen)
// runs the same Session for each of its simulated jobs.
//
// Join waits: a refusal that clears with time (the gateway answered with a
// Retry-After: busy, draining, a rate or quota; or it could not be reached
// or did not answer in time) is retried with jittered backoff for as long
// as JoinTimeout allows, and the user is told once on stderr. Only a
// definite refusal (a bad or revoked token, a ban, the policy, a full
// gateway; with several gateways, from every one) ends the job's start.
//
// Supervise first picks the transport (auto: UDP if a handshake completes
// within TransportTimeout, else the TCP/TLS stream on the control port),
// then holds the lease through a control session (control.Client.Attach:
// the join's own connection, upgraded; a lease watch with a gateway that
// predates sessions), renewing it on the lease's interval. The session
// ends at once when the gateway process stops and within three heartbeats
// (15 s) when the network fails silently, and that silence counts towards
// the failover threshold; a renewal that finds the lease unknown also ends
// it. Then the job keeps running and the session reconnects with backoff
// (250 ms doubling to 2 s): a gateway that comes back with a new instance
// id (it restarted and restored the lease from its state) gets a fresh
// handshake, so new connections work again within about a second; a lease
// the gateway no longer knows is joined again with the same key. With
// several gateways, a gateway lost for FailoverAfter is given up: the
// session joins the least loaded other one. Whenever the lease address
// differs from the one the job's namespace was made with, a
// tunnel.Readdress decorator on the TUN translates between the two, so the
// job never needs reconfiguring.

// Defaults of the transport, join and reconnect settings.
const (
	DefaultTransportTimeout = 3 * time.Second
	DefaultFailoverAfter    = 10 * time.Second
	// DefaultJoinTimeout is how long a job waits for a gateway that is
	// busy, draining, over a rate or quota, or unreachable, before it
	// gives up (--join-timeout): a gateway restart or a site's largest
	// array must not fail jobs.
	DefaultJoinTimeout = 5 * time.Minute
	// RequestTimeout bounds each control request (connecting included).
	RequestTimeout = 20 * time.Second
	backoffMin     = 250 * time.Millisecond
	backoffMax     = 2 * time.Second
	healthTimeout  = 3 * time.Second
	// joinBackoffMin and joinBackoffMax bound the waits between joins
	// when the gateway names none (unreachable, no answer in time).
	joinBackoffMin = time.Second
	joinBackoffMax = 15 * time.Second
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
	// bearer is what that report said of bearer tokens (bearer.go).
	bearer bool
	// last is the lease this session last held at this gateway, if any:
	// a join there again proves it (JoinRequest.Replace), should the
	// gateway still hold it after a failover away and back.
	last *control.LeaseRef
}

// SessionConfig configures a Session.
type SessionConfig struct {
	Logger *slog.Logger
	// Stderr receives what the user must see: waiting for a busy
	// gateway, a lease gone for good. nil: nothing.
	Stderr io.Writer
	// Gateways are the configured gateways (ParseGateways), each with
	// its own control client.
	Gateways []Gateway
	// Key is the job's WireGuard private key.
	Key wgkey.Key
	// Join is the join request; its PublicKey is Key's.
	Join control.JoinRequest
	// Transport is TransportAuto ("" too), TransportUDP or TransportTCP;
	// TransportTimeout, FailoverAfter and JoinTimeout are as in Config
	// (zero: their defaults).
	Transport                                    string
	TransportTimeout, FailoverAfter, JoinTimeout time.Duration
	// EgressFile keeps the job's egress file (EgressFileEnv) up to date.
	EgressFile bool
	// Dialer, if not nil, is how Gateways' clients reach their gateways
	// (NewDialer); the fleet's members the session learns are dialled
	// with it too, and the transport's log lines name its path.
	Dialer *siteproxy.Dialer
	// attest makes the joins' MUNGE credentials (attest.go); nil: none.
	attest *nodeAttest
	// bearer finds the job's bearer token (bearer.go); nil: none.
	bearer *jobBearer
}

// SessionStats counts what a session went through while supervised.
type SessionStats struct {
	// RenewErrors counts failed renewals; Lost the times the session with
	// the gateway ended and had to be reopened; Restarts the gateway
	// restarts seen (a new instance); Failovers the moves to another
	// gateway; Rejoins the joins again after the gateway lost the lease.
	RenewErrors, Lost, Restarts, Failovers, Rejoins uint64
}

// Session is a job's hold on its gateways (see the theory of operation
// above). Make it with NewSession; Join, then StartTunnel, then
// Supervise in the background; Release and Close at the end. Its fields
// are owned by the goroutine that runs Supervise once it runs; before and
// after, by the caller. Lease, Gateway and Stats may be called from any
// goroutine.
type Session struct {
	// att makes the joins' MUNGE credentials (attest.go); nil: none.
	att       *nodeAttest
	dialer    *siteproxy.Dialer // nil: direct
	bearer    *jobBearer
	log       *slog.Logger
	stderr    io.Writer
	gws       []*gatewayEntry
	priv      wgkey.Key
	req       control.JoinRequest
	transport string // configured: auto, udp or tcp
	wait      time.Duration
	failover  time.Duration
	joinWait  time.Duration // JoinTimeout
	warnAfter time.Duration // with udp or tcp forced: when to warn about no handshake
	// bypass is the site-local bypass the gateway sent (lease and
	// session events); its counters go with every renewal.
	bypass *bypass.Engine
	// bypassBase are its counters when the current lease began: reports
	// are per lease.
	bypassBase []control.BypassCount

	cur      *gatewayEntry
	lease    control.Lease
	endpoint netip.AddrPort
	instance string // the gateway instance last seen by a session

	// jobAddrs and jobDNS are the job's tunnel addresses and resolvers
	// as its namespace was configured (both families).
	jobAddrs, jobDNS []netip.Addr
	rd               *tunnel.Readdress
	// tunMTU is the job's tunnel MTU, chosen once by takePathMTU (mtu.go).
	tunMTU int
	bind   *tunnel.Bind
	wg     *tunnel.Client
	using  string // transport in use: udp or tcp
	// egressOn asks for the job's egress file, kept in egressDir
	// (egressfile.go).
	egressOn  bool
	egressDir string

	// view is what other goroutines may read: the current gateway and
	// lease.
	view  atomic.Pointer[sessionView]
	stats struct{ renewErrors, lost, restarts, failovers, rejoins atomic.Uint64 }

	relMu sync.Mutex
	rel   struct { // guarded by relMu: the lease to release at exit
		cc  *control.Client
		ref control.LeaseRef
		att *control.Session // the open control session, if any
	}
}

// sessionView is a snapshot of a session's gateway and lease.
type sessionView struct {
	gateway string
	lease   control.Lease
}

// NewSession returns a session that has not joined yet.
func NewSession(cfg SessionConfig) *Session {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stderr := cfg.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	gws := make([]*gatewayEntry, len(cfg.Gateways))
	for i, g := range cfg.Gateways {
		gws[i] = &gatewayEntry{addr: g.Addr, cc: g.CC}
	}
	req := cfg.Join
	req.PublicKey = cfg.Key.PublicKey()
	s := &Session{
		att: cfg.attest, dialer: cfg.Dialer, bearer: cfg.bearer, log: log, stderr: stderr, gws: gws, priv: cfg.Key, req: req,
		transport: cfg.Transport, wait: cfg.TransportTimeout, failover: cfg.FailoverAfter, joinWait: cfg.JoinTimeout,
		warnAfter: HandshakeWarnAfter, bypass: bypass.NewEngine(log.With("component", "bypass")), egressOn: cfg.EgressFile,
	}
	if s.transport == "" {
		s.transport = TransportAuto
	}
	if s.wait <= 0 {
		s.wait = DefaultTransportTimeout
	}
	if s.failover <= 0 {
		s.failover = DefaultFailoverAfter
	}
	if s.joinWait <= 0 {
		s.joinWait = DefaultJoinTimeout
	}
	return s
}

// Join joins the least loaded gateway, waiting out refusals that clear
// with time for at most the session's JoinTimeout.
func (s *Session) Join(ctx context.Context) error {
	return s.join(ctx, nil, s.joinWait)
}

// Lease returns the session's current lease.
func (s *Session) Lease() control.Lease {
	if v := s.view.Load(); v != nil {
		return v.lease
	}
	return control.Lease{}
}

// Gateway returns the address of the session's current gateway, as
// configured.
func (s *Session) Gateway() string {
	if v := s.view.Load(); v != nil {
		return v.gateway
	}
	return ""
}

// Stats returns the session's counters.
func (s *Session) Stats() SessionStats {
	return SessionStats{RenewErrors: s.stats.renewErrors.Load(), Lost: s.stats.lost.Load(),
		Restarts: s.stats.restarts.Load(), Failovers: s.stats.failovers.Load(), Rejoins: s.stats.rejoins.Load()}
}

// JobAddr returns the job's (first) tunnel address as its namespace (or
// stack) was made with: the address the job sends from, whatever the
// current lease's.
func (s *Session) JobAddr() netip.Addr {
	if len(s.jobAddrs) == 0 {
		return netip.Addr{}
	}
	return s.jobAddrs[0]
}

// setCurrent makes gw and ls the session's gateway and lease.
func (s *Session) setCurrent(gw *gatewayEntry, ls control.Lease, ep netip.AddrPort) {
	s.cur, s.lease, s.endpoint = gw, ls, ep
	gw.last = &control.LeaseRef{ID: ls.ID, Secret: ls.Secret}
	s.view.Store(&sessionView{gateway: gw.addr, lease: ls})
	s.writeEgressFile()
	s.setBypass(ls.Bypass)
	s.bypassBase = s.bypass.Report()
	s.relMu.Lock()
	s.rel.cc, s.rel.ref = gw.cc, control.LeaseRef{ID: ls.ID, Secret: ls.Secret}
	s.relMu.Unlock()
}

// rank is Rank over the session's gateways.
func (s *Session) rank(ctx context.Context, skip *gatewayEntry) []*gatewayEntry {
	gws := make([]Gateway, len(s.gws))
	si := -1
	for i, g := range s.gws {
		gws[i] = Gateway{Addr: g.addr, CC: g.cc}
		if g == skip {
			si = i
		}
	}
	var out []*gatewayEntry
	for _, r := range Rank(ctx, s.log, gws, si) {
		out = append(out, s.gws[r.Index])
		if r.Health != (control.Health{}) {
			s.gws[r.Index].checks, s.gws[r.Index].bearer = cmp.Or(r.Health.Attest, "none"), r.Health.Bearer
		}
		if len(s.gws) > 1 {
			s.log.Debug("gateway load", "gateway", s.gws[r.Index].addr, "jobs", r.Health.Jobs,
				"bits_per_sec", int64(r.Health.RxBitsPerSec+r.Health.TxBitsPerSec))
		}
	}
	return out
}

// join joins the least loaded gateway but skip, trying the others in order
// when one refuses, and waits out refusals that clear with time (see
// transient) for at most budget: the first wait is told to the user on
// stderr, once. It sets the session's gateway and lease.
func (s *Session) join(ctx context.Context, skip *gatewayEntry, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	backoff := joinBackoffMin
	told := false
	for {
		err := s.joinRanked(ctx, skip)
		if err == nil {
			if told {
				fmt.Fprintf(s.stderr, "airlock: joined gateway %s\n", s.cur.addr)
			}
			return nil
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		wait, ok := transient(err)
		if !ok {
			return err
		}
		if wait <= 0 {
			wait, backoff = backoff, min(2*backoff, joinBackoffMax)
		}
		wait = spreadWait(wait)
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%w; gave up after waiting %v (--join-timeout)", err, budget.Round(time.Second))
		}
		wait = min(wait, left) // then one last try
		if !told {
			told = true
			fmt.Fprintf(s.stderr, "airlock: %s; waiting for it, up to %v more (--join-timeout)\n",
				waitReason(err), left.Round(time.Second))
		}
		s.log.Info("join refused for now; waiting", "err", err, "in", wait.Round(time.Millisecond), "left", left.Round(time.Second))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// joinRanked makes one round of joins: the ranked gateways in order, until
// one takes the job. With several gateways its error joins theirs.
func (s *Session) joinRanked(ctx context.Context, skip *gatewayEntry) error {
	rs := s.rank(ctx, skip)
	if len(rs) == 0 {
		return errNoGateway{list: s.gatewayList()}
	}
	var errs []error
	for _, gw := range rs {
		req := s.req
		req.Replace = gw.last
		jctx, cancel := context.WithTimeout(ctx, RequestTimeout)
		ls, err := s.signedJoin(jctx, gw, req)
		if errors.Is(err, control.ErrKeyInUse) {
			if req, err = s.newKey(gw, err); err == nil {
				ls, err = s.signedJoin(jctx, gw, req)
			}
		}
		var ep netip.AddrPort
		if err == nil {
			ep, err = resolveEndpoint(jctx, ls.Endpoint, gw.addr)
		}
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if len(s.gws) == 1 {
				return err
			}
			s.log.Warn("join refused; trying the next gateway", "gateway", gw.addr, "err", err)
			errs = append(errs, err)
			continue
		}
		if len(s.gws) > 1 {
			s.log.Info("joined the least loaded gateway", "gateway", gw.addr, "of", s.gatewayList())
		}
		s.setCurrent(gw, ls, ep)
		s.learnMembers(ls.Members, RequestTimeout)
		return nil
	}
	return fmt.Errorf("no gateway took the job: %w", errors.Join(errs...))
}

// signedJoin joins gw with req and the join's MUNGE credentials, if the
// session makes them for gw. A credential this node cannot make is a
// definite error (errAttest), never waited out.
func (s *Session) signedJoin(ctx context.Context, gw *gatewayEntry, req control.JoinRequest) (control.Lease, error) {
	req, err := s.att.sign(ctx, s, gw, req)
	if err != nil {
		return control.Lease{}, errAttest{err}
	}
	if req, err = s.bearer.add(ctx, s, gw, req); err != nil {
		return control.Lease{}, errAttest{err}
	}
	ls, err := gw.cc.Join(ctx, req)
	s.att.spent(req, err)
	return ls, s.att.explain(req, err)
}

// errAttest is a join this node could not sign: munged is missing or
// refused (the message says which). Waiting does not fix it.
type errAttest struct{ err error }

func (e errAttest) Error() string { return e.err.Error() }
func (e errAttest) Unwrap() error { return e.err }

// errNoGateway: every gateway is draining (or, with several, unreachable).
type errNoGateway struct{ list string }

func (e errNoGateway) Error() string {
	return "no gateway to join: every gateway is unreachable or draining (" + e.list + ")"
}

// transient reports whether a join's error clears with time, and the wait
// the gateway asked for (0: none named). A gateway's refusal with a
// Retry-After clears with time (busy, draining, a rate or quota); one
// without is definite (bad token, ban, policy, a full gateway, a key in
// use), and so are a wrong pin and a bad endpoint in the lease.
// Everything else (unreachable, no answer in time, a connection cut) is
// the gateway being away or busy: it clears with time. With several
// gateways, the error is transient if any gateway's is, with the shortest
// wait named.
func transient(err error) (time.Duration, bool) {
	if siteproxy.IsRefusal(err) {
		return 0, false // the site's proxy forbids the way or wants credentials: waiting does not help
	}
	for err != nil {
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			var wait time.Duration
			found := false
			for _, x := range e.Unwrap() {
				if w, ok := transient(x); ok {
					if !found || (w > 0 && (wait == 0 || w < wait)) {
						wait = w
					}
					found = true
				}
			}
			return wait, found
		case *control.APIError:
			return e.RetryAfter, e.RetryAfter > 0
		}
		if _, ok := err.(errAttest); ok {
			return 0, false
		}
		if x, ok := err.(interface{ Is(error) bool }); (ok && x.Is(control.ErrPinMismatch)) || err == control.ErrPinMismatch || err == errBadEndpoint {
			return 0, false
		}
		err = errors.Unwrap(err)
	}
	return 0, true
}

// waitReason is the user's sentence for a transient join error.
func waitReason(err error) string {
	var ae *control.APIError
	if errors.As(err, &ae) {
		return fmt.Sprintf("the gateway cannot take the job yet (%s: %s)", ae.Code, ae.Message)
	}
	return fmt.Sprintf("the gateway does not answer (%v)", err)
}

// spreadWait is d with ±20% jitter, and up to 50% more for waits the gateway
// named, so that the jobs it turned away do not come back all at once.
func spreadWait(d time.Duration) time.Duration {
	return jitter(d) + time.Duration(rand.Int64N(int64(d/2)+1))
}

// maxGateways bounds the gateways a session knows, whatever a fleet's
// member list says.
const maxGateways = 64

// learnMembers adds the fleet's gateways that a lease names (and that
// the session does not know by address) to the session's list, so that a
// job given one gateway of a fleet fails over to the others. Their pins
// come from a gateway this client pinned.
func (s *Session) learnMembers(ms []control.Member, timeout time.Duration) {
	known := map[string]bool{}
	for _, g := range s.gws {
		known[g.addr] = true
	}
	added := 0
	for _, m := range ms {
		if known[m.Gateway] || len(s.gws) >= maxGateways {
			continue
		}
		// One pin, or during the member's key rotation two ("next|current").
		pins, err := control.ParsePins(m.Pin)
		if err != nil {
			s.log.Warn("fleet member with a bad pin left out", "gateway", m.Gateway, "err", err)
			continue
		}
		var opts []control.ClientOption
		if s.dialer != nil {
			opts = append(opts, control.WithDial(s.dialer.DialContext))
		}
		cc, err := control.NewClient(m.Gateway, strings.Join(pins, "|"), timeout, opts...)
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

func (s *Session) gatewayList() string {
	var a []string
	for _, g := range s.gws {
		a = append(a, g.addr)
	}
	return strings.Join(a, ",")
}

func (s *Session) ref() control.LeaseRef {
	return control.LeaseRef{ID: s.lease.ID, Secret: s.lease.Secret}
}

// Release gives the current lease back, over the open control session if
// there is one (no new connection), else with a request; Run calls it at
// exit. A second call does nothing, unless the session joined again since.
func (s *Session) Release() {
	s.relMu.Lock()
	cc, ref, att := s.rel.cc, s.rel.ref, s.rel.att
	s.rel.cc, s.rel.att = nil, nil
	s.relMu.Unlock()
	if cc == nil {
		return
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer rcancel()
	if rep := s.bypassReport(); len(rep) > 0 {
		// The last counters, so the gateway's totals are complete.
		var err error
		if att != nil {
			_, err = att.Renew(rctx, control.RenewRequest{Bypass: rep})
		} else {
			_, err = cc.RenewReport(rctx, control.RenewRequest{LeaseRef: ref, Bypass: rep})
		}
		if err != nil {
			s.log.Debug("final bypass report", "lease", ref.ID, "err", err)
		}
	}
	if att != nil {
		err := att.Release(rctx)
		if err == nil || errors.Is(err, control.ErrUnknownLease) {
			return
		}
		s.log.Debug("release over the control session; trying a request", "lease", ref.ID, "err", err)
	}
	if err := cc.Release(rctx, ref); err != nil {
		s.log.Warn("release lease", "lease", ref.ID, "err", err)
	}
}

// Close closes the tunnel (if started) and every control client.
func (s *Session) Close() {
	if s.wg != nil {
		s.wg.Close()
	}
	s.closeClients()
}

// closeClients closes every control client's idle connections.
func (s *Session) closeClients() {
	for _, g := range s.gws {
		g.cc.Close()
	}
}

// StartTunnel starts WireGuard on the job's TUN towards the current
// gateway. With --transport tcp the stream is opened at once.
func (s *Session) StartTunnel(ctx context.Context, dev tun.Device) error {
	gwKey := s.lease.GatewayPublicKey // validated by control.Client.Join
	s.jobAddrs, s.jobDNS = addrsOf(s.lease.Addresses), s.lease.DNS
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
			s.wg = nil
			return fmt.Errorf("--transport tcp: %w", err)
		}
		s.log.Info("transport: tcp (--transport tcp)", "gateway", s.cur.addr, "path", s.path())
	}
	return nil
}

// dialStream opens the TCP transport to the current gateway and sends
// everything over it.
func (s *Session) dialStream(ctx context.Context) error {
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

// path says how the current gateway's control port is reached: directly
// or through the site's web proxy, and why.
func (s *Session) path() string {
	if s.dialer == nil {
		return "direct"
	}
	if p, ok := s.dialer.Path(s.cur.addr); ok {
		return p.String()
	}
	return "direct"
}

// selectTransport is the auto transport choice at start-up.
func (s *Session) selectTransport(ctx context.Context) {
	if s.transport != TransportAuto {
		if !s.WaitHandshake(ctx, time.Time{}, s.warnAfter) && ctx.Err() == nil {
			s.log.Warn("no WireGuard handshake with the gateway yet; the job has no network until it completes",
				"gateway", s.cur.addr, "transport", s.using, "waited", s.warnAfter,
				"hint", "with --transport udp, UDP to the gateway may be blocked: try --transport auto")
		}
		return
	}
	t0 := time.Now()
	// The lease is renewed only once the transport is chosen: a wait
	// longer than half of what the lease has left (a gateway with a
	// short --renew-interval) would let it expire before the first
	// renewal, and the TCP transport would then be refused.
	wait := s.wait
	if left := time.Until(s.lease.Expires) / 2; left > 0 && left < wait {
		wait = left
	}
	if s.WaitHandshake(ctx, time.Time{}, wait) {
		s.log.Info("transport: udp (WireGuard handshake completed)", "gateway", s.cur.addr, "took", time.Since(t0).Round(time.Millisecond))
		return
	}
	if ctx.Err() != nil {
		return
	}
	if err := s.dialStream(ctx); err != nil {
		s.log.Warn("no WireGuard handshake over UDP and the TCP transport failed too; the job has no network until one works",
			"gateway", s.cur.addr, "waited", wait, "err", err)
		return
	}
	s.log.Warn("transport: tcp: no WireGuard handshake over UDP, switched to TCP/TLS on the control port (is UDP to the gateway blocked?)",
		"gateway", s.cur.addr, "udp_endpoint", s.endpoint, "waited", wait, "path", s.path())
	if !s.WaitHandshake(ctx, time.Time{}, HandshakeWarnAfter) && ctx.Err() == nil {
		s.log.Warn("no WireGuard handshake over TCP either; the job has no network until it completes", "gateway", s.cur.addr)
	}
}

// recheckTransport repeats the auto choice after a move to another
// gateway or lease while on UDP: UDP to the new gateway may be blocked
// where it was not to the old one.
func (s *Session) recheckTransport(ctx context.Context) {
	if s.transport == TransportAuto && s.using == TransportUDP {
		s.selectTransport(ctx)
	}
}

// WaitHandshake reports whether a handshake later than after completes
// within d. It wakes when the bind says a handshake message arrived
// (tunnel.Bind.HandshakeNotify) and then reads the device's state, which
// is costly to read and which wireguard-go updates a moment after the
// message, at growing intervals (handshakeLookFirst, doubling up to
// handshakeLookMax) for handshakeLookFor; and every handshakeLookIdle
// besides, for a message that came before it looked. (It polled every
// 5 ms before: 200 wake-ups a second for as long as it waited.)
func (s *Session) WaitHandshake(ctx context.Context, after time.Time, d time.Duration) bool {
	done := func() bool { return s.wg.LastHandshake().After(after) }
	if done() {
		return true
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	idle := time.NewTicker(handshakeLookIdle)
	defer idle.Stop()
	look := time.NewTimer(time.Hour)
	look.Stop()
	defer look.Stop()
	var step time.Duration
	var lookUntil time.Time
	for {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return done()
		case <-s.bind.HandshakeNotify():
			step, lookUntil = handshakeLookFirst, time.Now().Add(handshakeLookFor)
			look.Reset(step)
		case now := <-look.C:
			if done() {
				return true
			}
			if now.Before(lookUntil) {
				step = min(2*step, handshakeLookMax)
				look.Reset(step)
			}
		case <-idle.C:
			if done() {
				return true
			}
		}
	}
}

// WaitHandshake's looks at the device after a handshake message: the
// first after handshakeLookFirst, then at doubling intervals up to
// handshakeLookMax, for handshakeLookFor; and one every
// handshakeLookIdle regardless.
const (
	handshakeLookFirst = 250 * time.Microsecond
	handshakeLookMax   = 20 * time.Millisecond
	handshakeLookFor   = 100 * time.Millisecond
	handshakeLookIdle  = 250 * time.Millisecond
)

// errStreamLost ends a control session when the TCP transport stream
// closed.
var errStreamLost = errors.New("TCP transport stream closed")

// Supervise keeps the job connected until ctx ends; see the theory of
// operation above.
func (s *Session) Supervise(ctx context.Context) {
	s.selectTransport(ctx)
	var lostSince time.Time
	delay := backoffMin
	for ctx.Err() == nil {
		att, err := s.cur.cc.Attach(ctx, s.ref())
		var lastHeard time.Time
		if err == nil {
			err = s.connected(ctx, att, &lostSince)
			lastHeard = att.LastEvent()
			delay = backoffMin
		}
		if ctx.Err() != nil {
			return
		}
		s.stats.lost.Add(1)
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
			if _, ok := transient(jerr); !ok {
				s.leaseGone(jerr, "THE GATEWAY NO LONGER KNOWS THIS JOB'S LEASE (expired while unreachable) AND REFUSES A NEW ONE",
					"check the token with the gateway's admin")
				return
			}
			err = jerr
		}
		s.noteLost(&lostSince, lastHeard, err)
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

// noteLost notes that the current gateway was lost with err: since now
// (or since lastHeard, when its watch went silent), if *lostSince is zero
// (the first loss), else it is still lost.
func (s *Session) noteLost(lostSince *time.Time, lastHeard time.Time, err error) {
	if !lostSince.IsZero() {
		s.log.Debug("gateway still unreachable", "gateway", s.cur.addr, "err", err, "for", time.Since(*lostSince).Round(time.Millisecond))
		return
	}
	*lostSince = time.Now()
	if errors.Is(err, control.ErrWatchSilent) && !lastHeard.IsZero() {
		*lostSince = lastHeard // silent since then: counts towards failover
	}
	s.log.Warn("lost the gateway; the job keeps running, reconnecting", "gateway", s.cur.addr, "err", err)
}

// leaseGone tells the user, once and loudly on stderr, that the job lost
// its network for good, and why; Supervise stops after it.
func (s *Session) leaseGone(err error, what, hint string) {
	fmt.Fprintf(s.stderr, "airlock: %s: %s\n"+
		"airlock: the job keeps running, but its network through the gateway is cut; %s\n", what, apiMessage(err), hint)
	s.log.Error("lease gone; not reconnecting", "lease", s.lease.ID, "gateway", s.cur.addr, "err", err)
}

func jitter(d time.Duration) time.Duration {
	return d - d/5 + time.Duration(rand.Int64N(int64(2*d/5)+1))
}

// connected runs while the control session att is open: it renews the
// lease and returns why the session ended. When ctx ends it leaves att
// open for Release.
func (s *Session) connected(ctx context.Context, att *control.Session, lostSince *time.Time) (err error) {
	s.relMu.Lock()
	s.rel.att = att
	s.relMu.Unlock()
	defer func() {
		if ctx.Err() != nil {
			return // Release uses att
		}
		s.relMu.Lock()
		if s.rel.att == att {
			s.rel.att = nil
		}
		s.relMu.Unlock()
		att.Close()
	}()
	if err := s.attached(ctx, att, lostSince); err != nil {
		return err
	}
	return s.serveSession(ctx, att)
}

// attached takes in what the gateway said as session att began: the
// site-local bypass, whether it restarted (then, or after a loss since
// *lostSince or of the TCP stream, the tunnel is brought back), and logs
// the gateway's return, clearing *lostSince.
func (s *Session) attached(ctx context.Context, att *control.Session, lostSince *time.Time) error {
	if att.First.Bypass != nil {
		s.setBypass(att.First.Bypass)
	}
	restarted := s.instance != "" && att.First.Instance != s.instance
	s.instance = att.First.Instance
	if restarted {
		s.stats.restarts.Add(1)
	}
	streamGone := s.using == TransportTCP && (s.bind.Stream() == nil || s.bind.Stream().Err() != nil)
	if restarted || streamGone || !lostSince.IsZero() {
		if err := s.resync(ctx, att.First.Resume.Std(), *lostSince); err != nil {
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
	return nil
}

// serveSession follows session att's events (bypass updates) and renews
// the lease on it, until ctx ends, the session or the TCP stream ends, or
// a renewal says the lease is gone.
func (s *Session) serveSession(ctx context.Context, att *control.Session) error {
	ended := make(chan error, 1)
	go func() {
		for {
			ev, err := att.Next()
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
			_, err := att.Renew(rctx, control.RenewRequest{Bypass: s.bypassReport(), Bearer: s.bearer.renewal(s)})
			cancel()
			if err != nil {
				s.stats.renewErrors.Add(1)
			}
			if errors.Is(err, control.ErrUnknownLease) || errors.Is(err, control.ErrLeaseEnded) {
				return err
			}
			if err != nil {
				s.log.Warn("renew lease failed; will retry", "lease", s.lease.ID, "err", err)
			}
		}
	}
}

// resync brings the tunnel back after the gateway was lost since lostAt
// (zero: not known). On UDP nothing is needed if a handshake completed
// since then (the restarted gateway started it, or the job's own
// WireGuard did), and if the gateway says it will start one (resume: it
// restarted and knows the job's endpoint) the session waits that long for
// it; otherwise, and on the TCP transport, it reconnects at once.
func (s *Session) resync(ctx context.Context, resume time.Duration, lostAt time.Time) error {
	if s.using == TransportUDP && !lostAt.IsZero() {
		if s.wg.LastHandshake().After(lostAt) {
			s.log.Debug("tunnel already re-established", "gateway", s.cur.addr)
			return nil
		}
		if resume > 0 {
			t0 := time.Now()
			if s.WaitHandshake(ctx, lostAt, resume) {
				s.log.Info("the restarted gateway re-established the tunnel", "gateway", s.cur.addr, "waited", time.Since(t0).Round(time.Millisecond))
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.Info("no handshake from the restarted gateway in the time it named; starting one", "gateway", s.cur.addr, "waited", resume)
		}
	}
	return s.reconnect(ctx)
}

// reconnect gives the WireGuard peer fresh handshake state (the gateway
// restarted, or the path was down long enough for sessions to be lost)
// and, on the TCP transport, a new stream.
func (s *Session) reconnect(ctx context.Context) error {
	if s.using == TransportTCP {
		if err := s.dialStream(ctx); err != nil {
			return err
		}
	}
	return s.wg.SetGateway(s.lease.GatewayPublicKey, s.endpoint)
}

// rejoin joins the current gateway again after it lost the lease.
func (s *Session) rejoin(ctx context.Context) error {
	old := s.lease.Addresses
	req := s.req
	if s.lease.ID != "" {
		// Proves the key's old lease is ours, should the gateway still
		// hold it.
		ref := s.ref()
		req.Replace = &ref
	}
	jctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	ls, err := s.signedJoin(jctx, s.cur, req)
	if errors.Is(err, control.ErrKeyInUse) {
		if req, err = s.newKey(s.cur, err); err == nil {
			ls, err = s.signedJoin(jctx, s.cur, req)
		}
	}
	if err != nil {
		return err
	}
	ep, err := resolveEndpoint(jctx, ls.Endpoint, s.cur.addr)
	if err != nil {
		return err
	}
	s.setCurrent(s.cur, ls, ep)
	s.instance = ""
	s.stats.rejoins.Add(1)
	s.readdress()
	if err := s.reconnect(ctx); err != nil {
		return err
	}
	s.recheckTransport(ctx)
	s.recheckPathMTU(ctx)
	s.log.Warn("the gateway had lost this job's lease; joined again", "gateway", s.cur.addr,
		"lease", ls.ID, "old_addrs", old, "new_addrs", ls.Addresses, "job_addrs", s.jobAddrs)
	return nil
}

// newKey gives the session a new WireGuard key after gw refused a join
// because another client holds the current one (inUse): someone who
// learnt the public key (it is not secret) joined with it while this
// job's lease was gone. It returns the join request to send with the new
// key, which has no lease to replace.
func (s *Session) newKey(gw *gatewayEntry, inUse error) (control.JoinRequest, error) {
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

// failTo moves the job to the least loaded other gateway.
func (s *Session) failTo(ctx context.Context, lostSince time.Time) error {
	old := s.cur
	if err := s.join(ctx, old, RequestTimeout); err != nil {
		return err
	}
	s.instance = ""
	s.stats.failovers.Add(1)
	s.readdress()
	if err := s.reconnect(ctx); err != nil {
		return err
	}
	s.recheckTransport(ctx)
	s.recheckPathMTU(ctx)
	s.log.Warn("failed over to another gateway: the job's open connections are broken, new ones go through it",
		"from", old.addr, "to", s.cur.addr, "lost_for", time.Since(lostSince).Round(time.Millisecond),
		"lease_addrs", s.lease.Addresses, "job_addrs", s.jobAddrs, "transport", s.using)
	return nil
}

// readdress points the TUN decorator at the current lease: the job keeps
// its addresses and resolvers of each family.
func (s *Session) readdress() {
	s.rd.Set(s.jobAddrs, addrsOf(s.lease.Addresses), s.jobDNS, s.lease.DNS)
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
func (s *Session) setBypass(b *control.Bypass) {
	if err := s.bypass.Update(b); err != nil {
		s.log.Warn("the gateway sent a site-local bypass this client cannot use; the old one stays in force", "err", err)
	}
}

// bypassReport returns the bypass counters of the current lease.
func (s *Session) bypassReport() []control.BypassCount {
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
