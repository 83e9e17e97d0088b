// SPDX-License-Identifier: MIT

package control

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// Connections per source (issue 33, item 6). Every connection the control
// server accepts counts against its source network (an IPv4 address or an
// IPv6 /64, as the failure limiter groups them) while it is open; a source
// that holds MaxConnsPerSource connections has its next ones closed at
// once, so that one host cannot take the gateway's file descriptors. A
// node's jobs hold one connection each (their lease sessions), so the
// bound is far above a node's jobs; nodes behind one NAT address share it.
//
// A connection that has carried no authenticated request (a join admitted,
// a lease's renewal, release or watch) is closed after unauthIdle idle
// (the TLS handshake and the first request are bounded by the server's
// header timeout), where an authenticated client's connection idles for
// the server's IdleTimeout.

// DefaultMaxConnsPerSource is ServerConfig.MaxConnsPerSource's default.
const DefaultMaxConnsPerSource = 4096

// unauthIdle is how long an idle connection that has carried no
// authenticated request stays open.
const unauthIdle = 15 * time.Second

// connTracker counts connections per source and closes idle
// unauthenticated ones. It is safe for concurrent use.
type connTracker struct {
	max     int
	idleFor time.Duration // unauthIdle; tests shorten it
	log     func(level slog.Level, msg string, args ...any)

	mu        sync.Mutex
	perSource map[netip.Prefix]int   // guarded by mu
	conns     map[net.Conn]*connInfo // guarded by mu: by the server's conn
}

// connInfo is what the tracker knows of one connection.
type connInfo struct {
	authed atomic.Bool
	idle   *time.Timer // guarded by connTracker.mu
}

type connInfoKey struct{}

// markAuthed records that the request of ctx was authenticated, so that
// its connection may idle as long as the server allows.
func markAuthed(ctx context.Context) {
	if ci, ok := ctx.Value(connInfoKey{}).(*connInfo); ok {
		ci.authed.Store(true)
	}
}

func newConnTracker(max int, log func(slog.Level, string, ...any)) *connTracker {
	if max <= 0 {
		max = DefaultMaxConnsPerSource
	}
	return &connTracker{max: max, idleFor: unauthIdle, log: log, perSource: map[netip.Prefix]int{}, conns: map[net.Conn]*connInfo{}}
}

// listener wraps l: connections over the per-source bound are closed as
// they are accepted.
func (t *connTracker) listener(l net.Listener) net.Listener { return &capListener{Listener: l, t: t} }

type capListener struct {
	net.Listener
	t *connTracker
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
		src := peerKey(ap.Addr())
		if l.t.add(src) {
			return &capConn{Conn: c, t: l.t, src: src}, nil
		}
		c.Close()
		l.t.log(slog.LevelWarn, "control connection refused: its source holds the most connections one source may hold", "remote", ap, "network", src, "max", l.t.max)
	}
}

// add counts a connection of src, or reports false if src holds max.
func (t *connTracker) add(src netip.Prefix) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.perSource[src] >= t.max {
		return false
	}
	t.perSource[src]++
	return true
}

func (t *connTracker) remove(src netip.Prefix) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.perSource[src]--; t.perSource[src] <= 0 {
		delete(t.perSource, src)
	}
}

// capConn uncounts itself once, when closed.
type capConn struct {
	net.Conn
	t    *connTracker
	src  netip.Prefix
	once sync.Once
}

func (c *capConn) Close() error {
	c.once.Do(func() { c.t.remove(c.src) })
	return c.Conn.Close()
}

// connContext is the http.Server's ConnContext: it gives the requests of
// c their connInfo.
func (t *connTracker) connContext(ctx context.Context, c net.Conn) context.Context {
	ci := &connInfo{}
	t.mu.Lock()
	t.conns[c] = ci
	t.mu.Unlock()
	return context.WithValue(ctx, connInfoKey{}, ci)
}

// connState is the http.Server's ConnState: an idle connection that has
// carried no authenticated request is closed after unauthIdle.
func (t *connTracker) connState(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ci := t.conns[c]
	if ci == nil {
		return
	}
	if ci.idle != nil {
		ci.idle.Stop()
		ci.idle = nil
	}
	switch st {
	case http.StateIdle:
		if !ci.authed.Load() {
			var tm *time.Timer
			tm = time.AfterFunc(t.idleFor, func() {
				t.mu.Lock()
				still := ci.idle == tm // not active again meanwhile
				t.mu.Unlock()
				if still {
					c.Close()
				}
			})
			ci.idle = tm
		}
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
	}
}

// SyscallConn passes on the underlying connection's, for the idle waiter
// of lease sessions (idle_linux.go).
func (c *capConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("connection has no file descriptor")
	}
	return sc.SyscallConn()
}

// Requests over lease sessions per source (issue 33, item 6). Each session
// has its own budget (sessionRequestRate); the sessions a source holds
// also share one, so that a host with many leases (up to its
// MaxConnsPerSource sessions) cannot multiply its session budget by its
// lease count. The shared budget is far above what a NATed cluster's
// renewals need: 10,000 jobs renewing every DefaultRenewInterval (30 s)
// send about 333 requests a second.
const (
	sourceRequestRate  = rate.Limit(1000)
	sourceRequestBurst = 2000
)

// sourceRequests holds the shared request budget of each source that has
// a lease session open; a source's entry goes with its last session. It
// is safe for concurrent use.
type sourceRequests struct {
	rate  rate.Limit
	burst int

	mu  sync.Mutex
	src map[netip.Prefix]*sourceBudget // guarded by mu
}

// sourceBudget is one source's shared budget and its open sessions.
type sourceBudget struct {
	lim      *rate.Limiter
	sessions int // guarded by sourceRequests.mu
}

func newSourceRequests(r rate.Limit, burst int) *sourceRequests {
	return &sourceRequests{rate: r, burst: burst, src: map[netip.Prefix]*sourceBudget{}}
}

// acquire returns src's shared budget for a session that opens.
func (s *sourceRequests) acquire(src netip.Prefix) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.src[src]
	if b == nil {
		b = &sourceBudget{lim: rate.NewLimiter(s.rate, s.burst)}
		s.src[src] = b
	}
	b.sessions++
	return b.lim
}

// release is acquire's undo, when the session closes.
func (s *sourceRequests) release(src netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.src[src]; b != nil {
		if b.sessions--; b.sessions <= 0 {
			delete(s.src, src)
		}
	}
}

// len reports how many sources have an entry (for tests).
func (s *sourceRequests) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.src)
}
