// SPDX-License-Identifier: MIT

package control

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/httpjson"
	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/jointoken"
	"github.com/airlock-vpn/airlock/internal/version"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"golang.org/x/time/rate"
)

// Server theory of operation: one http.Server over a TLS 1.3 listener,
// HTTP/1.1 only, so that a client's renewals reuse one kept-alive
// connection. Every POST handler decodes a size-limited JSON body that may
// not carry unknown fields, then authenticates (join token or lease
// secret) and finally calls the Backend. Bad requests, bad tokens and
// unknown leases count as failures for the limiter. A join from a source
// network whose failure bucket is empty is refused up front, before its
// token is looked at; a request that names a lease (renew, release,
// watch, tunnel) is looked at first and refused only if it does not prove
// a live lease, so that a neighbour's failures from the same address never
// take a running job's lease down (limited.go).

// Defaults for [ServerConfig].
const (
	DefaultFailureLimit = rate.Limit(0.5) // one failure per 2 s
	DefaultFailureBurst = 5
	DefaultIdleTimeout  = 5 * time.Minute
)

// maxBodySize bounds request bodies.
const maxBodySize = 64 << 10

// MsgBadToken is the message of a [CodeBadToken] response.
const MsgBadToken = "token rejected: unknown, revoked or expired token; ask the gateway admin for a new one (airlock token create)"

// Backend is what the gateway provides to the control server. Its methods
// are called concurrently, each from the goroutine serving one request,
// with the request's context; they must not retain the request after
// returning.
type Backend interface {
	// Join grants a lease to an authenticated client: req has a valid
	// public key, token is the verified join token's record and remote
	// the client's TCP address. It returns an error wrapping ErrNoAddress
	// when no tunnel address or port block is free, or ErrBadRequest with
	// a message for the user when it refuses req.
	Join(ctx context.Context, req JoinRequest, token jointoken.Token, remote netip.AddrPort) (Lease, error)
	// Renew extends the lease ref names. It returns an error wrapping
	// ErrUnknownLease if there is no such lease or the secret is wrong.
	Renew(ctx context.Context, ref LeaseRef) (RenewResponse, error)
	// Release frees the lease ref names at once, with the same errors as
	// Renew.
	Release(ctx context.Context, ref LeaseRef) error
	// Health reports the gateway's load. It must be cheap and must not
	// block.
	Health() Health
	// CheckLease returns nil while ref names a live lease, else an error
	// wrapping ErrUnknownLease. It must be cheap; lease watches call it.
	CheckLease(ref LeaseRef) error
	// Tunnel carries WireGuard over the control port (the TCP transport):
	// it checks ref and returns attach, to which the server hands the
	// upgraded connection (TLS, deadlines cleared); attach owns it.
	// Errors are as for Renew, or ErrNotSupported for a backend without
	// the TCP transport.
	Tunnel(ctx context.Context, ref LeaseRef, remote netip.AddrPort) (attach func(net.Conn), err error)
	// LeaseBypass returns the site-local bypass of the lease ref names
	// (nil: none) and a channel closed when it may have changed (a
	// reload; nil: never). Errors are as for CheckLease, or
	// ErrNotSupported for a backend without site-local bypass (its
	// watches then carry no bypass at all).
	LeaseBypass(ref LeaseRef) (*Bypass, <-chan struct{}, error)
	// HandshakeDue returns how long the gateway may still take to start
	// the WireGuard handshake with the client of the lease ref names
	// itself (a restarted gateway re-establishes its restored sessions,
	// paced), or 0 when it will not: the client then starts one. It must
	// be cheap; it is asked for the first event of every lease session
	// and watch.
	HandshakeDue(ref LeaseRef) time.Duration
	// ReportBypass records the client's cumulative bypass counters for
	// the lease ref names, after a successful renewal of it. counts has
	// at most 256 entries with distinct, non-empty rule names. A backend
	// without site-local bypass ignores them.
	ReportBypass(ref LeaseRef, counts []BypassCount)
	// Reidentify gives the lease ref names the identity of the bearer
	// token its renewal carried (verified; nil: the renewal carried
	// none), before Renew. It returns an error wrapping ErrBearer if the
	// token names another issuer or subject than the lease's, errors
	// as for Renew otherwise. A backend without bearer identity returns
	// nil.
	Reidentify(ref LeaseRef, id *identity.Issued) error
}

// ServerConfig configures a [Server]. Logger, Store, Backend and
// Certificate are required.
type ServerConfig struct {
	Logger *slog.Logger
	// Store verifies join tokens (the gateway's token store).
	Store       jointoken.Verifier
	Backend     Backend
	Certificate tls.Certificate
	// Version is the gateway's airlock version, sent with every lease;
	// OnClientVersion, if set, is called with version.Label of every
	// join's client version, served or not.
	Version         string
	OnClientVersion func(label string)
	// Identities, if set, replaces Certificate: the identities the server
	// presents, which change during a key rotation (rotate.go).
	Identities *Identities
	// FailureLimit and FailureBurst bound failed attempts (bad requests,
	// bad tokens, unknown leases) per source IPv4 address or IPv6 /64:
	// after FailureBurst failures, requests are refused with
	// CodeRateLimited until the bucket refills at FailureLimit per second.
	// Zero values mean DefaultFailureLimit and DefaultFailureBurst;
	// rate.Inf disables the limit.
	FailureLimit rate.Limit
	FailureBurst int
	// IdleTimeout closes kept-alive connections idle for longer; zero
	// means DefaultIdleTimeout. It should exceed the renew interval.
	IdleTimeout time.Duration
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
	// WatchHeartbeat is how often a lease watch (PathWatch) sends a
	// heartbeat; zero means DefaultWatchHeartbeat.
	WatchHeartbeat time.Duration
	// OnJoin, if set, is called after every join request with the error
	// code answered ("" for success) and how long the request took, for
	// metrics. It must not block.
	OnJoin func(code string, took time.Duration)
	// CaptureRelay, if set (a gateway of a fleet), serves
	// PathFleetCapture (relay.go).
	CaptureRelay CaptureRelay
	// MaxConnsPerSource bounds the control connections one source
	// network holds open (conns.go); zero means
	// DefaultMaxConnsPerSource.
	MaxConnsPerSource int
	// Attest, if set, verifies the MUNGE credentials joins carry
	// (attest.go); joins with a valid one need no token, and with
	// Attest.Required none is taken without one. Nil: a gateway without
	// attested identity, which takes joins by token only and ignores
	// credentials.
	Attest Attester
	// Bearer, if set, verifies the bearer tokens of joins and renewals
	// (bearer.go). Nil: the gateway takes none, and refuses a join that
	// carries one.
	Bearer BearerVerifier
}

// Server is the gateway's control API server. Create it with [NewServer];
// it is safe for concurrent use.
type Server struct {
	log     *slog.Logger
	store   jointoken.Verifier
	backend Backend
	now     func() time.Time
	fails   *failureLimiter[netip.Prefix]
	// uidFails counts the failures of joins whose uid was attested
	// against that uid, not their source address: a neighbour on a node
	// cannot get the node's address limited, and stays named.
	uidFails *failureLimiter[uint32]
	onJoin   func(code string, took time.Duration)
	version  string
	onVer    func(label string)
	tlsConf  *tls.Config
	http     *http.Server

	// logLim rate-limits Warn logs of failures; suppressed counts those
	// dropped since the last one logged.
	logLim     *rate.Limiter
	suppressed atomic.Int64

	// stop is closed by Shutdown: it ends watches, which Shutdown would
	// otherwise wait for.
	attest Attester
	bearer BearerVerifier
	// conns counts connections per source and closes idle
	// unauthenticated ones (conns.go).
	conns *connTracker
	// srcReqs is the request budget a source's lease sessions share.
	srcReqs *sourceRequests

	stop     chan struct{}
	stopOnce sync.Once
	watchHB  time.Duration
	watches  watchCounts
	sessions sessionSet
	// bypassWake wakes the sessions when a bypass notice closes.
	bypassWake bypassWaker
	hbLine     atomic.Pointer[heartbeat] // the sessions' heartbeat line
	// idle waits for idle sessions' requests (idle_linux.go); nil: each
	// session has a goroutine that reads it. Serve makes it and Shutdown
	// ends it, under idleMu; handlers read it once Serve runs.
	idleMu sync.Mutex
	idle   *idleWaiter
	// listeners are what Serve accepts on, under idleMu: Shutdown closes
	// them before it ends the sessions.
	listeners []net.Listener
	// noSessions makes the server answer as one older than lease
	// sessions (tests).
	noSessions atomic.Bool
	relay      CaptureRelay
}

// NewServer returns a server for cfg. It does not listen: call Serve.
func NewServer(cfg ServerConfig) *Server {
	s := &Server{
		log:     cfg.Logger,
		store:   cfg.Store,
		backend: cfg.Backend,
		now:     cfg.Now,
		onJoin:  cfg.OnJoin,
		version: cfg.Version,
		onVer:   cfg.OnClientVersion,
		logLim:  rate.NewLimiter(1, 10),
		stop:    make(chan struct{}),
		watchHB: cfg.WatchHeartbeat,
		relay:   cfg.CaptureRelay,
		attest:  cfg.Attest,
		bearer:  cfg.Bearer,
	}
	if s.watchHB <= 0 {
		s.watchHB = DefaultWatchHeartbeat
	}
	s.conns = newConnTracker(cfg.MaxConnsPerSource, s.logLimited)
	s.srcReqs = newSourceRequests(sourceRequestRate, sourceRequestBurst)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	limit, burst := cfg.FailureLimit, cfg.FailureBurst
	if limit == 0 {
		limit = DefaultFailureLimit
	}
	if burst <= 0 {
		burst = DefaultFailureBurst
	}
	s.fails = newFailureLimiter[netip.Prefix](limit, burst)
	s.uidFails = newFailureLimiter[uint32](limit, burst)
	idle := cfg.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	ids := cfg.Identities
	if ids == nil {
		ids = NewIdentities(cfg.Certificate, nil)
	}
	s.tlsConf = &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: ids.GetCertificate,
		NextProtos:     []string{"http/1.1"},
		// Clients keep one connection per job and never resume a TLS
		// session: a ticket would cost every join an encryption and a
		// message for nothing.
		SessionTicketsDisabled: true,
	}
	mux := http.NewServeMux()
	mux.HandleFunc(PathJoin, s.handleJoin)
	mux.HandleFunc(PathRenew, s.handleRenew)
	mux.HandleFunc(PathRelease, s.handleRelease)
	mux.HandleFunc(PathHealth, s.handleHealth)
	mux.HandleFunc(PathTunnel, s.handleTunnel)
	mux.HandleFunc(PathWatch, s.handleWatch)
	mux.HandleFunc(PathSession, s.handleSession)
	mux.HandleFunc(PathFleetCapture, s.handleFleetCapture)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeBadRequest, "no such control API path: "+truncate(r.URL.Path, 100))
	})
	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       idle,
		MaxHeaderBytes:    16 << 10,
		// TLS handshake errors from scanners and mis-pinned clients.
		ErrorLog:     slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}, // no HTTP/2
		ConnContext:  s.conns.connContext,
		ConnState:    s.conns.connState,
	}
	return s
}

// Serve accepts TLS connections on l and serves the control API until
// Shutdown, after which it returns nil. It closes l when it returns.
func (s *Server) Serve(l net.Listener) error {
	s.idleMu.Lock()
	select {
	case <-s.stop:
		s.idleMu.Unlock()
		l.Close()
		return nil
	default:
		if w, err := newIdleWaiter(); err == nil {
			s.idle = w
		} else {
			s.log.Debug("lease sessions are read by a goroutine each", "err", err)
		}
	}
	l = &onceListener{Listener: l}
	s.listeners = append(s.listeners, l)
	s.idleMu.Unlock()
	err := s.http.Serve(tls.NewListener(s.conns.listener(l), s.tlsConf))
	select {
	case <-s.stop:
		return nil // Shutdown closed l
	default:
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("control server: %w", err)
}

// onceListener is a listener whose Close may be called again (by
// Shutdown, then by http.Server's Shutdown) without an error.
type onceListener struct {
	net.Listener
	once sync.Once
	err  error
}

func (l *onceListener) Close() error {
	l.once.Do(func() { l.err = l.Listener.Close() })
	return l.err
}

// Shutdown stops accepting connections and waits, at most until ctx is
// done, for requests in progress to finish; see http.Server.Shutdown.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	// The listeners close before the sessions end: with them open, every
	// job whose session closeAll ended dialled again at once, and 10,000
	// new TLS handshakes kept a stopping gateway busy for more than 30 s.
	s.idleMu.Lock()
	for _, l := range s.listeners {
		l.Close()
	}
	s.listeners = nil
	s.idleMu.Unlock()
	s.sessions.closeAll()
	s.idleMu.Lock()
	if s.idle != nil {
		s.idle.close()
	}
	s.idleMu.Unlock()
	return s.http.Shutdown(ctx)
}

func (s *Server) handleJoin(w http.ResponseWriter, r *http.Request) {
	if s.onJoin != nil {
		start := time.Now()
		cw := &codeWriter{ResponseWriter: w}
		w = cw
		defer func() { s.onJoin(cw.code, time.Since(start)) }()
	}
	remote := remoteAddr(r)
	if !s.checkMethod(w, r, http.MethodPost) {
		return
	}
	// A limited source is refused up front, but for a join that carries
	// a MUNGE credential: it is judged on its own (authenticate), so that
	// a neighbour's failures from a node do not stop its other users.
	lim := s.limitOf(remote)
	if lim.on && (s.attest == nil || r.ContentLength > maxBodySize) {
		s.refuseLimited(w, r, remote, lim.wait)
		return
	}
	req, err := decodeJoinRequest(http.MaxBytesReader(w, r.Body, maxBodySize))
	if lim.on && (err != nil || req.Attest == nil) {
		s.refuseLimited(w, r, remote, lim.wait)
		return
	}
	if err != nil {
		s.refuse(w, "join", remote, fmt.Errorf("%w: invalid join request: %w", ErrBadRequest, err))
		return
	}
	if s.onVer != nil {
		s.onVer(version.Label(req.Version))
	}
	if err := version.CheckClient(req.Version); err != nil {
		// Not a failure of the client's credentials: not rate-limited.
		s.refuse(w, "join", remote, fmt.Errorf("%w: %w", ErrVersionUnsupported, err))
		return
	}
	tok, ok := s.authenticate(w, r, &req, remote, lim)
	if !ok {
		return
	}
	lease, err := s.backend.Join(r.Context(), req, tok, remote)
	if err != nil {
		s.refuseJoin(w, remote, &req, err)
		return
	}
	if req.Attested != nil {
		s.attest.Settle(req, nil)
	}
	markAuthed(r.Context())
	lease.GatewayVersion = s.version
	s.log.Debug("join", "lease", lease.ID, "token", tok.Name, "remote", remote,
		"addresses", lease.Addresses, "batch_job_id", req.Job.BatchJobID,
		"hostname", req.Job.Hostname, "user", req.Job.User, "uid", req.Job.UID,
		"client_version", version.Label(req.Version), "attested", req.Attested.String())
	httpjson.Write(w, http.StatusOK, lease)
}

// authenticate checks a join's MUNGE credentials and its token (and the
// token's source networks); it sets req.Attested. It writes the refusal
// and returns false if the join may not proceed. The credentials come
// first, so that the failures of a join whose uid is attested count
// against that uid, not its source address (refuseJoin), and a join from
// a limited source (lim) that proves its uid is judged on its own.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, req *JoinRequest, remote netip.AddrPort, lim limit) (jointoken.Token, bool) {
	var tok jointoken.Token
	if req.Attest != nil && s.attest != nil {
		a, err := s.attest.Verify(r.Context(), *req, remote)
		switch {
		case err != nil && lim.on:
			s.refuseLimited(w, r, remote, lim.wait)
			return tok, false
		case err != nil:
			// ErrAttestation's row, or an internal error.
			s.refuse(w, "join", remote, err)
			return tok, false
		}
		req.Attested = a
		if a == nil && lim.on {
			s.refuseLimited(w, r, remote, lim.wait)
			return tok, false
		}
		if a != nil {
			if wait, on := s.uidFails.limited(a.UID, s.now()); on {
				secs := max(1, int64(math.Ceil(wait.Seconds())))
				s.refuseJoin(w, remote, req, WithRetryAfter(fmt.Errorf("%w: too many failed joins by uid %d; retry in %d s, after fixing the token or request", ErrRateLimited, a.UID, secs), wait))
				return tok, false
			}
		}
	}
	if req.Token != "" {
		var err error
		tok, err = s.store.VerifyToken(req.Token, s.now())
		if err != nil {
			if errors.Is(err, jointoken.ErrBad) {
				err = fmt.Errorf("%w: %w", ErrBadToken, err)
			}
			if errors.Is(err, jointoken.ErrUnavailable) {
				// A fail-closed fleet member without its database.
				err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
			}
			s.refuseJoin(w, remote, req, err)
			return tok, false
		}
		if !tok.AllowsFrom(remote.Addr()) {
			s.refuseJoin(w, remote, req, &tokenFromError{
				msg:  fmt.Sprintf("token %s may not be used from %s: the gateway's admin restricted it to other networks (airlock token list shows them; airlock token restrict changes them)", tok.Name, remote.Addr()),
				from: tok.From,
			})
			return tok, false
		}
	}
	if req.Bearer != "" {
		id, err := s.verifyBearer(r.Context(), req.Bearer)
		if err != nil {
			s.refuse(w, "join", remote, err)
			return tok, false
		}
		if req.Token != "" {
			id.As = "" // accounted under the join token, not the issuer's name
		}
		req.Issued = id
	} else if s.bearer != nil && s.bearer.Required() {
		s.refuse(w, "join", remote, fmt.Errorf("%w: %s", ErrBearerRequired, MsgBearerRequired))
		return tok, false
	}
	if req.Attested == nil {
		required := s.attest != nil && s.attest.Required()
		switch {
		case required || tok.Attest:
			msg := MsgAttestationRequired
			if tok.Attest && !required {
				msg = "token " + tok.Name + " requires a MUNGE credential with every join: " + msg[strings.Index(msg, "run airlock run"):]
			}
			if req.Attest != nil && s.attest == nil {
				msg = "this gateway cannot check MUNGE credentials (start it with --attest munge)"
			}
			s.refuse(w, "join", remote, fmt.Errorf("%w: %s", ErrAttestationRequired, msg))
			return tok, false
		case req.Token == "" && req.Issued == nil:
			s.refuse(w, "join", remote, fmt.Errorf("%w: invalid join request: missing token: set AIRLOCK_TOKEN (this gateway does not take joins by MUNGE credential alone)", ErrBadRequest))
			return tok, false
		}
	}
	return tok, true
}

// refuseJoin answers a refused join: as refuse, but a join whose uid was
// attested has its failure counted against that uid rather than its
// source address, and its credentials are settled (a job credential kept
// for the job's retry if the refusal clears with time).
func (s *Server) refuseJoin(w http.ResponseWriter, remote netip.AddrPort, req *JoinRequest, err error) {
	a := req.Attested
	if a == nil {
		s.refuse(w, "join", remote, err)
		return
	}
	s.attest.Settle(*req, err)
	uid := a.UID
	s.refuseAs(w, "join", remote, &uid, err)
}

// tokenFromError is a join with a valid token from outside the token's
// source networks: a bad token, whose answer (msg) says why but not which
// networks would do, which would tell whoever holds a leaked token where
// to use it; the gateway's log (Error) names them.
type tokenFromError struct {
	msg  string
	from []netip.Prefix
}

func (e *tokenFromError) Error() string        { return fmt.Sprintf("%s; allowed: %v", e.msg, e.from) }
func (e *tokenFromError) Is(target error) bool { return target == ErrBadToken }

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request) {
	remote := remoteAddr(r)
	if !s.checkMethod(w, r, http.MethodPost) {
		return
	}
	lim := s.limitOf(remote)
	req, err := decodeRenewRequest(http.MaxBytesReader(w, r.Body, maxBodySize))
	if err != nil {
		s.leaseError(w, r, lim, "renew", remote, fmt.Errorf("%w: invalid renew request: %w", ErrBadRequest, err))
		return
	}
	ref := req.LeaseRef
	ref.From = remote
	if err := s.reidentify(r.Context(), ref, req.Bearer); err != nil {
		s.leaseError(w, r, lim, "renew", remote, err)
		return
	}
	resp, err := s.backend.Renew(r.Context(), ref)
	if err != nil {
		s.leaseError(w, r, lim, "renew", remote, err)
		return
	}
	if len(req.Bypass) > 0 {
		s.backend.ReportBypass(ref, req.Bypass)
	}
	markAuthed(r.Context())
	s.log.Debug("renew", "lease", ref.ID, "remote", remote, "expires", resp.Expires)
	httpjson.Write(w, http.StatusOK, resp)
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) {
	remote := remoteAddr(r)
	if !s.checkMethod(w, r, http.MethodPost) {
		return
	}
	lim := s.limitOf(remote)
	ref, err := decodeLeaseRef(http.MaxBytesReader(w, r.Body, maxBodySize))
	if err != nil {
		s.leaseError(w, r, lim, "release", remote, fmt.Errorf("%w: invalid release request: %w", ErrBadRequest, err))
		return
	}
	ref.From = remote
	if err := s.backend.Release(r.Context(), ref); err != nil {
		s.leaseError(w, r, lim, "release", remote, err)
		return
	}
	s.log.Debug("release", "lease", ref.ID, "remote", remote)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, http.MethodGet)
		return
	}
	httpjson.Write(w, http.StatusOK, s.backend.Health())
}

// admit checks the method and the failure limiter; it writes the error
// response and returns false if the request must not proceed. Only
// requests that carry no lease (joins) are admitted this way.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, method string, remote netip.AddrPort) bool {
	if !s.checkMethod(w, r, method) {
		return false
	}
	lim := s.limitOf(remote)
	if !lim.on {
		return true
	}
	s.refuseLimited(w, r, remote, lim.wait)
	return false
}

// checkMethod writes 405 and returns false unless r's method is method.
func (s *Server) checkMethod(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method != method {
		methodNotAllowed(w, method)
		return false
	}
	return true
}

// refuse answers err with its row of the refusals table (errors.go):
// status, code, message and Retry-After. It counts a failure against
// remote where the row says so, and logs: internal errors at Error, client
// failures at Warn, other refusals at Info (both rate-limited).
func (s *Server) refuse(w http.ResponseWriter, op string, remote netip.AddrPort, err error) {
	s.refuseAs(w, op, remote, nil, err)
}

// refuseAs is refuse for a request whose uid was attested (uid not nil):
// its failure counts against the uid, and the logs name it.
func (s *Server) refuseAs(w http.ResponseWriter, op string, remote netip.AddrPort, uid *uint32, err error) {
	r := refusalOf(err)
	var who []any
	if uid != nil {
		who = []any{"uid", *uid}
	}
	if r.failure {
		if uid != nil {
			if s.uidFails.fail(*uid, s.now()) {
				s.logLimited(slog.LevelWarn, "attested uid rate-limited after repeated failed joins: its joins are refused for a while, other users of its node are not", append(who, "remote", remote)...)
			}
		} else if s.fails.fail(peerKey(remote.Addr()), s.now()) {
			s.logLimited(slog.LevelWarn, "source rate-limited after repeated failed requests: its requests without a valid MUNGE credential are refused for a while", "remote", remote, "network", peerKey(remote.Addr()))
		}
	}
	msg := err.Error()
	if r.message != nil {
		msg = r.message(err)
	}
	if secs := retryAfterSeconds(err, r); secs > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	writeError(w, r.status, r.code, msg)
	switch {
	case r.code == CodeInternal:
		s.log.Error("control request: internal error", "op", op, "remote", remote, "err", err)
	case r.failure:
		s.logLimited(slog.LevelWarn, "control request failed", append([]any{"op", op, "remote", remote, "code", r.code, "err", err}, who...)...)
	default:
		s.logLimited(slog.LevelInfo, "control request refused", append([]any{"op", op, "remote", remote, "code", r.code, "err", err}, who...)...)
	}
}

// logLimited logs at level, at most as often as logLim allows; the next
// line logged says how many were suppressed meanwhile.
func (s *Server) logLimited(level slog.Level, msg string, args ...any) {
	if !s.logLim.Allow() {
		s.suppressed.Add(1)
		return
	}
	s.log.Log(context.Background(), level, msg, append(args, "suppressed", s.suppressed.Swap(0))...)
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, CodeBadRequest, "method not allowed; use "+allow)
}

func remoteAddr(r *http.Request) netip.AddrPort {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	if cw, ok := w.(*codeWriter); ok {
		cw.code = code
	}
	httpjson.Write(w, status, ErrorResponse{Code: code, Message: msg})
}

// decodeJoinRequest reads one JoinRequest from r and validates it: known
// fields only, a token and a valid WireGuard public key.
func decodeJoinRequest(r io.Reader) (JoinRequest, error) {
	var req JoinRequest
	if err := decodeJSON(r, &req); errors.Is(err, wgkey.ErrInvalid) {
		return JoinRequest{}, fmt.Errorf("public_key: not a WireGuard public key: %w", errors.Unwrap(err))
	} else if err != nil {
		return JoinRequest{}, err
	}
	if req.Token == "" && req.Attest == nil && req.Bearer == "" {
		return JoinRequest{}, errors.New("missing token: set AIRLOCK_TOKEN (or join with a MUNGE credential or a bearer token where the gateway takes them)")
	}
	if err := checkBearer("bearer", req.Bearer); err != nil {
		return JoinRequest{}, err
	}
	if req.Attest != nil {
		if err := req.Attest.validate(); err != nil {
			return JoinRequest{}, err
		}
	}
	if req.PublicKey.IsZero() {
		return JoinRequest{}, errors.New("missing public_key: want the client's WireGuard public key")
	}
	if err := req.Job.Validate(); err != nil {
		return JoinRequest{}, err
	}
	if len(req.Expose) > maxExpose {
		return JoinRequest{}, fmt.Errorf("expose: %d ports, more than %d", len(req.Expose), maxExpose)
	}
	if req.Ports < 0 || req.Ports > 65535 {
		return JoinRequest{}, fmt.Errorf("ports: %d, want 0 to 65535", req.Ports)
	}
	if req.Replace != nil && (req.Replace.ID == "" || req.Replace.Secret == "") {
		return JoinRequest{}, errors.New("replace: missing lease id or secret")
	}
	return req, nil
}

func decodeLeaseRef(r io.Reader) (LeaseRef, error) {
	var ref LeaseRef
	if err := decodeJSON(r, &ref); err != nil {
		return LeaseRef{}, err
	}
	if ref.ID == "" || ref.Secret == "" {
		return LeaseRef{}, errors.New("missing lease id or secret")
	}
	return ref, nil
}

// decodeJSON decodes exactly one JSON object from r into v, rejecting
// unknown fields and trailing data.
func decodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return fmt.Errorf("body larger than %d KiB", mbe.Limit>>10)
		}
		if errors.Is(err, io.EOF) {
			return errors.New("empty body: want a JSON object")
		}
		return fmt.Errorf("bad JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("bad JSON: data after the object")
	}
	return nil
}

// codeWriter remembers the error code written through writeError, for
// ServerConfig.OnJoin.
type codeWriter struct {
	http.ResponseWriter
	code string
}
