// SPDX-License-Identifier: MIT

package control

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// Lease sessions: one connection per job.
//
// A job that joined keeps its lease through one TLS connection for as long
// as it runs: the join's own kept-alive connection, upgraded. The client
// asks GET PathSession with "Connection: Upgrade", "Upgrade:
// airlock-session/1" and the lease's id and secret in the headers
// (HeaderLeaseID, HeaderLeaseSecret); the gateway checks the lease and
// answers "101 Switching Protocols". From then on both sides write
// newline-delimited JSON objects of at most maxBodySize bytes:
//
//   - the gateway sends WatchEvent lines, exactly as a lease watch does
//     (PathWatch): one at once (with the lease's site-local bypass), one per
//     heartbeat, one when a reload changed the bypass (at the next
//     heartbeat), a last one with Ended when the gateway ends the lease on
//     purpose; and it answers each request with a WatchEvent whose Reply is
//     set;
//   - the client sends SessionRequest lines: OpRenew (with its bypass
//     counters) on the lease's renewal interval, OpRelease when the job
//     ends. The lease is the session's: requests carry no id or secret.
//
// An idle session costs the gateway its connection and no goroutine: its
// socket waits in one epoll set for all sessions (idle_linux.go), and a
// short-lived goroutine reads what arrives; heartbeats are written by a
// timer (AfterFunc), so there are no wake-ups between them either. A session whose client sent nothing for
// the server's IdleTimeout, whose lease ended, or whose heartbeat could
// not be written within a heartbeat interval is closed. Shutdown closes
// every session at once, so clients learn that the gateway stopped.
//
// A gateway older than sessions answers the upgrade 404 (code
// bad_request); the client then keeps its lease as before, with a lease
// watch and renew requests (Client.Attach does either).

// PathSession is the path of the lease session upgrade.
const PathSession = "/" + Version + "/session"

// SessionProtocol is the Upgrade token of a lease session.
const SessionProtocol = "airlock-session/1"

// Ops of a SessionRequest.
const (
	OpRenew   = "renew"
	OpRelease = "release"
)

// SessionRequest is one line a client sends on a lease session.
type SessionRequest struct {
	// ID is chosen by the client and echoed in the reply.
	ID uint64 `json:"id"`
	// Op is OpRenew or OpRelease.
	Op string `json:"op"`
	// Bypass, with OpRenew, are the client's cumulative bypass counters
	// for the lease (as RenewRequest.Bypass).
	Bypass []BypassCount `json:"bypass,omitempty"`
	// Bearer, with OpRenew, is the job's current bearer token (as
	// RenewRequest.Bearer).
	Bearer string `json:"bearer,omitempty"`
}

// SessionReply answers one SessionRequest, in a WatchEvent's Reply.
type SessionReply struct {
	// ID is the request's.
	ID uint64 `json:"id"`
	// Expires is the lease's expiry after a renewal.
	Expires time.Time `json:"expires,omitzero"`
	// Error, if set, says why the request failed, with the code the HTTP
	// API answers the same failure with.
	Error *ErrorResponse `json:"error,omitempty"`
}

// serverSession is one lease session at the gateway.
type serverSession struct {
	s      *Server
	conn   net.Conn
	br     *bufio.Reader
	ref    LeaseRef
	remote netip.AddrPort
	timer  *time.Timer // the next heartbeat
	closed atomic.Bool
	// lastRequest is when the client last sent a request (unix nanos).
	lastRequest atomic.Int64
	// reqs bounds the requests the session carries (sessionRequestRate)
	// and srcReqs those of all its source's sessions (sourceRequestRate);
	// refused counts those refused in a row.
	reqs    *rate.Limiter
	srcReqs *rate.Limiter
	refused atomic.Int32

	// mu serialises closing with arming the idle waiter (idle_linux.go);
	// it guards inEpoll. fd and waitID are set once, before arming.
	mu      sync.Mutex
	inEpoll bool
	fd      int
	waitID  uint32

	// wmu serialises writes and guards what follows.
	wmu      sync.Mutex
	instance string
	bypassCh <-chan struct{} // closed when the bypass may have changed
}

// sessionBufSize is the size of a session's read buffer: requests are
// small; a longer line is read in pieces.
const sessionBufSize = 512

func (s *Server) handleSession(w http.ResponseWriter, r *http.Request) {
	if s.noSessions.Load() {
		writeError(w, http.StatusNotFound, CodeBadRequest, "no such control API path: "+PathSession)
		return
	}
	remote := remoteAddr(r)
	if !s.checkMethod(w, r, http.MethodGet) {
		return
	}
	lim := s.limitOf(remote)
	ref, ok := s.upgradeRef(w, r, lim, "session", remote, SessionProtocol)
	if !ok {
		return
	}
	if err := s.backend.CheckLease(ref); err != nil {
		s.leaseError(w, r, lim, "session", remote, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		s.refuse(w, "session", remote, errors.New("connection cannot be taken over"))
		return
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		s.refuse(w, "session", remote, fmt.Errorf("take over connection: %w", err))
		return
	}
	ss := &serverSession{s: s, conn: c, ref: ref, remote: remote,
		instance: s.backend.Health().Instance, reqs: rate.NewLimiter(sessionRequestRate, sessionRequestBurst),
		srcReqs: s.srcReqs.acquire(peerKey(remote.Addr()))}
	if rw.Reader.Buffered() > 0 {
		// The client sent a request before it read the 101.
		ss.br = rw.Reader
	} else {
		ss.br = bufio.NewReaderSize(c, sessionBufSize)
	}
	c.SetDeadline(time.Time{})
	ss.lastRequest.Store(time.Now().UnixNano())
	// An idle session waits in the idle waiter, without a goroutine;
	// where there is none (not Linux, or a connection without a socket),
	// a goroutine of its own reads the session.
	waiting := s.idle != nil && s.idle.add(ss) == nil
	// Held until the first event is out, so that no heartbeat precedes it.
	ss.wmu.Lock()
	ss.timer = time.AfterFunc(s.watchHB, ss.tick)
	if !s.sessions.add(ss) {
		ss.wmu.Unlock()
		ss.timer.Stop()
		if waiting {
			s.idle.remove(ss)
		}
		c.Close()
		return
	}
	first, bypassCh := ss.firstEvent()
	ss.bypassCh = bypassCh
	s.bypassWake.watch(s, bypassCh)
	var hdr bytes.Buffer
	hdr.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + SessionProtocol + "\r\nConnection: Upgrade\r\n\r\n")
	hdr.Write(first)
	err = ss.writeLocked(hdr.Bytes())
	ss.wmu.Unlock()
	if err != nil {
		ss.close()
		s.log.Debug("session upgrade", "remote", remote, "err", err)
		return
	}
	s.log.Debug("session opened", "lease", ref.ID, "remote", remote)
	// The handler returns and the HTTP server forgets the connection.
	switch {
	case !waiting:
		go ss.serve()
	case ss.br.Buffered() > 0:
		go ss.readable()
	default:
		ss.arm()
	}
}

// rawConn returns the session's socket, if it has one.
func (ss *serverSession) rawConn() (syscall.Conn, bool) {
	tc, ok := ss.conn.(*tls.Conn)
	if !ok {
		return nil, false
	}
	sc, ok := tc.NetConn().(syscall.Conn)
	return sc, ok
}

// arm puts the session back into the idle waiter, unless it is closed.
func (ss *serverSession) arm() {
	ss.mu.Lock()
	var err error
	if !ss.closed.Load() {
		err = ss.s.idle.armLocked(ss)
	}
	ss.mu.Unlock()
	if err != nil {
		ss.s.log.Warn("session: cannot wait for the client's requests; closing it", "lease", ss.ref.ID, "err", err)
		ss.close()
	}
}

// readableTimeout bounds the wait for the rest of a request that began
// to arrive.
const readableTimeout = 30 * time.Second

// readable reads and answers the requests that have arrived (the idle
// waiter saw the socket readable), then arms the waiter again. It runs on
// a goroutine of its own that ends when the session is idle again.
func (ss *serverSession) readable() {
	// Ordered after the arming that led here (through the kernel, which
	// the race detector does not see).
	ss.mu.Lock()
	ss.mu.Unlock()
	for {
		ss.conn.SetReadDeadline(time.Now().Add(readableTimeout))
		line, err := readLine(ss.br, maxBodySize)
		if err != nil {
			if !ss.closed.Load() {
				ss.s.log.Debug("session ends", "lease", ss.ref.ID, "remote", ss.remote, "err", err)
			}
			ss.close()
			return
		}
		if !ss.answer(line, ss.markRequest()) {
			ss.close()
			return
		}
		if ss.br.Buffered() > 0 {
			continue
		}
		// More in the TLS connection's buffer? Look without waiting.
		ss.conn.SetReadDeadline(time.Now())
		if _, err := ss.br.Peek(1); err == nil {
			continue
		} else if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
			ss.close()
			return
		}
		break
	}
	ss.conn.SetReadDeadline(time.Time{})
	ss.arm()
}

// firstEvent returns the session's first line (with the lease's bypass,
// if the backend offers one) and the channel closed when that bypass may
// have changed.
func (ss *serverSession) firstEvent() ([]byte, <-chan struct{}) {
	ev := WatchEvent{Instance: ss.instance, Heartbeat: Duration(ss.s.watchHB),
		Resume: Duration(ss.s.backend.HandshakeDue(ss.ref))}
	changed, line := ss.s.watchBypass(ss.ref, ev)
	if line == nil {
		line = marshalLine(ev)
	}
	return line, changed
}

// serve reads and answers the client's requests until the session ends.
func (ss *serverSession) serve() {
	defer ss.close()
	idle := ss.s.http.IdleTimeout
	for {
		ss.conn.SetReadDeadline(time.Now().Add(idle))
		line, err := readLine(ss.br, maxBodySize)
		if err != nil {
			if !ss.closed.Load() {
				ss.s.log.Debug("session ends", "lease", ss.ref.ID, "remote", ss.remote, "err", err)
			}
			return
		}
		if !ss.answer(line, ss.markRequest()) {
			return
		}
	}
}

// A lease session carries a job's renewals (one per renew interval, a
// few seconds at the least) and its bypass reports: at most
// sessionRequestRate requests a second, in bursts of sessionRequestBurst.
// A request over it is answered rate_limited without reaching the
// gateway; sessionRefusedMax of them in a row end the session (issue 33,
// item 6): a lease secret does not buy unbounded work.
const (
	sessionRequestRate  = rate.Limit(5)
	sessionRequestBurst = 20
	sessionRefusedMax   = 100
	// sessionQuiet is the silence after which a session's request is not
	// held to its source's shared budget (conns.go).
	sessionQuiet = time.Second
)

// markRequest records a request's arrival and reports whether the session
// was quiet for sessionQuiet before it.
func (ss *serverSession) markRequest() bool {
	now := time.Now().UnixNano()
	return time.Duration(now-ss.lastRequest.Swap(now)) >= sessionQuiet
}

// answer carries out one request and writes its reply; it returns false
// when the session must end (released, or the reply could not be written).
// A request that ends a quiet spell (a renewal, as clients send them) is
// never held to the source's shared budget, so that sessions that flood
// cannot starve their neighbours' renewals on the same node.
func (ss *serverSession) answer(line []byte, quiet bool) bool {
	req, err := decodeSessionRequest(line)
	reply := SessionReply{ID: req.ID}
	end := false
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limited := ss.reqs != nil && !ss.reqs.Allow()
	srcLimited := !limited && !quiet && ss.srcReqs != nil && !ss.srcReqs.Allow()
	limited = limited || srcLimited
	if !limited {
		ss.refused.Store(0)
	} else if n := ss.refused.Add(1); n >= sessionRefusedMax {
		ss.s.logLimited(slog.LevelWarn, "lease session ended: too many requests", "lease", ss.ref.ID, "remote", ss.remote, "refused", n)
		return false
	}
	switch {
	case srcLimited:
		err = WithRetryAfter(fmt.Errorf("%w: more than %v requests a second over the lease sessions of this source", ErrRateLimited, float64(ss.s.srcReqs.rate)), time.Second)
	case limited:
		err = WithRetryAfter(fmt.Errorf("%w: more than %v requests a second over this lease session", ErrRateLimited, float64(sessionRequestRate)), time.Second)
	case err != nil:
		err = fmt.Errorf("%w: invalid session request: %w", ErrBadRequest, err)
	case req.Op == OpRenew:
		var resp RenewResponse
		if err = ss.s.reidentify(ctx, ss.ref, req.Bearer); err != nil {
			break
		}
		if resp, err = ss.s.backend.Renew(ctx, ss.ref); err == nil {
			reply.Expires = resp.Expires
			if len(req.Bypass) > 0 {
				ss.s.backend.ReportBypass(ss.ref, req.Bypass)
			}
			ss.s.log.Debug("renew", "lease", ss.ref.ID, "remote", ss.remote, "expires", resp.Expires)
		}
	case req.Op == OpRelease:
		if err = ss.s.backend.Release(ctx, ss.ref); err == nil {
			ss.s.log.Debug("release", "lease", ss.ref.ID, "remote", ss.remote)
			end = true
		}
	}
	if err != nil {
		r := refusalOf(err)
		msg := err.Error()
		if r.message != nil {
			msg = r.message(err)
		}
		reply.Error = &ErrorResponse{Code: r.code, Message: msg}
		if r.code == CodeInternal {
			ss.s.log.Error("session request: internal error", "op", req.Op, "lease", ss.ref.ID, "remote", ss.remote, "err", err)
		}
	}
	return ss.send(WatchEvent{Instance: ss.instance, Heartbeat: Duration(ss.s.watchHB), Reply: &reply}) && !end
}

// tick is the heartbeat: it checks the lease (a lease ended on purpose
// gets its last event with Ended), sends the bypass if a reload changed
// it, else a heartbeat, and schedules the next.
func (ss *serverSession) tick() {
	if ss.closed.Load() {
		return
	}
	if idle := ss.s.http.IdleTimeout; time.Since(time.Unix(0, ss.lastRequest.Load())) > idle {
		ss.s.log.Debug("session ends: no request", "lease", ss.ref.ID, "remote", ss.remote, "for", idle)
		ss.close()
		return
	}
	if err := ss.s.backend.CheckLease(ss.ref); err != nil {
		ss.s.log.Debug("session ends: lease gone", "lease", ss.ref.ID, "remote", ss.remote, "err", err)
		if errors.Is(err, ErrLeaseEnded) {
			ss.send(WatchEvent{Instance: ss.instance, Heartbeat: Duration(ss.s.watchHB),
				Ended: &ErrorResponse{Code: CodeLeaseEnded, Message: err.Error()}})
		}
		ss.close()
		return
	}
	ev := WatchEvent{Instance: ss.instance, Heartbeat: Duration(ss.s.watchHB)}
	line := ss.s.heartbeatLine(ss.instance)
	ss.wmu.Lock()
	select {
	case <-ss.bypassCh:
		var b []byte
		if ss.bypassCh, b = ss.s.watchBypass(ss.ref, ev); b != nil {
			line = b
		}
		ss.s.bypassWake.watch(ss.s, ss.bypassCh)
	default:
	}
	err := ss.writeLocked(line)
	ss.wmu.Unlock()
	if err != nil {
		ss.close()
		return
	}
	ss.timer.Reset(ss.s.watchHB)
}

// heartbeatLine returns the heartbeat line of instance, marshalled once
// for all sessions.
func (s *Server) heartbeatLine(instance string) []byte {
	if hb := s.hbLine.Load(); hb != nil && hb.instance == instance {
		return hb.line
	}
	hb := &heartbeat{instance: instance, line: marshalLine(WatchEvent{Instance: instance, Heartbeat: Duration(s.watchHB)})}
	s.hbLine.Store(hb)
	return hb.line
}

// heartbeat is a marshalled heartbeat line and the instance it names.
type heartbeat struct {
	instance string
	line     []byte
}

// send writes ev; false if it could not, and then the session is closed.
func (ss *serverSession) send(ev WatchEvent) bool {
	ss.wmu.Lock()
	err := ss.writeLocked(marshalLine(ev))
	ss.wmu.Unlock()
	if err != nil {
		ss.close()
		return false
	}
	return true
}

// writeLocked writes b within a heartbeat interval.
func (ss *serverSession) writeLocked(b []byte) error {
	ss.conn.SetWriteDeadline(time.Now().Add(ss.s.watchHB))
	_, err := ss.conn.Write(b)
	return err
}

// close ends the session; it may be called more than once, from any
// goroutine.
func (ss *serverSession) close() {
	ss.mu.Lock()
	if ss.closed.Load() {
		ss.mu.Unlock()
		return
	}
	ss.closed.Store(true) // under mu: never armed from now on
	ss.mu.Unlock()
	ss.timer.Stop()
	ss.conn.Close()
	ss.s.sessions.remove(ss)
	if ss.srcReqs != nil {
		ss.s.srcReqs.release(peerKey(ss.remote.Addr()))
	}
	if ss.waitID != 0 {
		ss.s.idle.remove(ss)
	}
}

func marshalLine(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("control: marshal %T: %v", v, err)) // only fixed types
	}
	return append(b, '\n')
}

// decodeSessionRequest decodes one request line: known fields, a known
// op, valid bypass counters.
func decodeSessionRequest(line []byte) (SessionRequest, error) {
	var req SessionRequest
	if err := decodeJSON(bytes.NewReader(line), &req); err != nil {
		return req, err
	}
	switch req.Op {
	case OpRenew:
		if err := checkBypassCounts(req.Bypass); err != nil {
			return req, err
		}
		if err := checkBearer("bearer", req.Bearer); err != nil {
			return req, err
		}
	case OpRelease:
		if len(req.Bypass) > 0 || req.Bearer != "" {
			return req, errors.New("bypass counters and bearer tokens go with a renewal")
		}
	default:
		return req, fmt.Errorf("unknown op %q: want %q or %q", truncate(req.Op, 20), OpRenew, OpRelease)
	}
	return req, nil
}

// readLine reads one line ending in '\n' (returned without it) of at most
// limit bytes from br.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == nil {
		return bytes.Clone(line[:len(line)-1]), nil
	}
	if !errors.Is(err, bufio.ErrBufferFull) {
		return nil, err
	}
	buf := bytes.Clone(line)
	for {
		line, err = br.ReadSlice('\n')
		if len(buf)+len(line) > limit+1 {
			return nil, fmt.Errorf("line longer than %d KiB", limit>>10)
		}
		buf = append(buf, line...)
		if err == nil {
			return buf[:len(buf)-1], nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// sessionSet holds the open sessions by lease id. It is safe for
// concurrent use; the zero value is empty.
type sessionSet struct {
	mu     sync.Mutex
	byID   map[string][]*serverSession // guarded by mu
	closed bool                        // guarded by mu: Shutdown began
}

// add registers ss; false if the server shuts down or the lease has
// maxWatchesPerLease sessions already.
func (c *sessionSet) add(ss *serverSession) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.byID[ss.ref.ID]) >= maxWatchesPerLease {
		return false
	}
	if c.byID == nil {
		c.byID = map[string][]*serverSession{}
	}
	c.byID[ss.ref.ID] = append(c.byID[ss.ref.ID], ss)
	return true
}

func (c *sessionSet) remove(ss *serverSession) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.byID[ss.ref.ID]
	for i, o := range l {
		if o == ss {
			l = append(l[:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(c.byID, ss.ref.ID)
	} else {
		c.byID[ss.ref.ID] = l
	}
}

// of returns the sessions of lease id.
func (c *sessionSet) of(id string) []*serverSession {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*serverSession(nil), c.byID[id]...)
}

// all returns the open sessions.
func (c *sessionSet) all() []*serverSession {
	c.mu.Lock()
	defer c.mu.Unlock()
	var all []*serverSession
	for _, l := range c.byID {
		all = append(all, l...)
	}
	return all
}

// bypassSpread is the time over which a reload's bypass events go out to
// all sessions, so that 10,000 of them are not written in one burst.
const bypassSpread = time.Second

// bypassWaker sends a changed bypass at once instead of at the sessions'
// next heartbeat: one goroutine per bypass notice channel (the gateway
// has one at a time, closed at a reload) ticks every session when it
// closes. The zero value is ready.
type bypassWaker struct {
	mu      sync.Mutex
	watched map[<-chan struct{}]bool // guarded by mu
}

// watch makes sure that the sessions are ticked when ch closes.
func (w *bypassWaker) watch(s *Server, ch <-chan struct{}) {
	if ch == nil {
		return
	}
	w.mu.Lock()
	if w.watched[ch] {
		w.mu.Unlock()
		return
	}
	if w.watched == nil {
		w.watched = map[<-chan struct{}]bool{}
	}
	w.watched[ch] = true
	w.mu.Unlock()
	go func() {
		select {
		case <-ch:
		case <-s.stop:
			return
		}
		w.mu.Lock()
		delete(w.watched, ch)
		w.mu.Unlock()
		all := s.sessions.all()
		for i, ss := range all {
			ss.timer.Reset(time.Duration(i) * (bypassSpread / time.Duration(len(all))))
		}
	}()
}

// len returns the number of open sessions.
func (c *sessionSet) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.byID {
		n += len(l)
	}
	return n
}

// closeAll closes every session and refuses new ones.
func (c *sessionSet) closeAll() {
	c.mu.Lock()
	c.closed = true
	var all []*serverSession
	for _, l := range c.byID {
		all = append(all, l...)
	}
	c.mu.Unlock()
	for _, ss := range all {
		ss.close()
	}
}

// Sessions returns the number of open lease sessions, for metrics.
func (s *Server) Sessions() int { return s.sessions.len() }

// errNoSessions means the gateway predates lease sessions.
var errNoSessions = errors.New("gateway has no lease sessions")

// Session is a job's hold on its lease at one gateway: the gateway's
// events (as a lease watch's) and the job's renewals and release, over the
// connection of its join (a lease session), or, with a gateway that
// predates sessions, over a lease watch and separate requests. Create it
// with [Client.Attach]. It is safe for concurrent use: one goroutine calls
// Next while others renew.
type Session struct {
	// First is the event the gateway sent at once.
	First WatchEvent

	c   *Client
	ref LeaseRef
	w   *Watch // a gateway without sessions: the lease's watch

	rw     io.ReadWriteCloser // the upgraded connection
	hb     time.Duration
	timer  *time.Timer     // closes rw after WatchMissedHeartbeats heartbeats of silence
	events chan WatchEvent // events that carry more than a heartbeat
	done   chan struct{}   // closed when the session ended; err says why
	err    error
	last   atomic.Int64 // unix nanoseconds of the last line from the gateway

	wmu sync.Mutex // serialises requests' writes

	mu      sync.Mutex
	expired bool                         // guarded by mu: the silence timer fired
	nextID  uint64                       // guarded by mu
	pending map[uint64]chan SessionReply // guarded by mu
}

// Attach opens the job's hold on lease ref: a lease session on the
// connection its join used, or, if the gateway predates sessions, a lease
// watch. It returns once the gateway's first event has arrived, within the
// client's timeout.
func (c *Client) Attach(ctx context.Context, ref LeaseRef) (*Session, error) {
	s, err := c.openSession(ctx, ref)
	if !errors.Is(err, errNoSessions) {
		return s, err
	}
	w, err := c.Watch(ctx, ref)
	if err != nil {
		return nil, err
	}
	return &Session{First: w.First, c: c, ref: ref, w: w}, nil
}

// openSession upgrades a connection to the gateway to a lease session.
func (c *Client) openSession(ctx context.Context, ref LeaseRef) (*Session, error) {
	timeout := c.timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodGet, c.base+PathSession, nil)
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", SessionProtocol)
	req.Header.Set(HeaderLeaseID, ref.ID)
	req.Header.Set(HeaderLeaseSecret, ref.Secret)
	// watchHTTP: no client-wide timeout, which would cut the session
	// when it expired.
	resp, err := c.watchHTTP.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, "session", err, !isDialError(err))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		ae := readAPIError(resp)
		if resp.StatusCode == http.StatusNotFound && ae.Code == CodeBadRequest {
			return nil, errNoSessions
		}
		return nil, fmt.Errorf("session at %s: %w", c.gateway, ae)
	}
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, fmt.Errorf("session at %s: upgraded connection is not writable", c.gateway)
	}
	s := &Session{c: c, ref: ref, rw: rw, events: make(chan WatchEvent, 4), done: make(chan struct{}),
		pending: map[uint64]chan SessionReply{}}
	s.timer = time.AfterFunc(timeout, s.silent)
	br := bufio.NewReaderSize(rw, sessionBufSize*2)
	line, err := readLine(br, maxResponseSize)
	if err == nil {
		err = json.Unmarshal(line, &s.First)
	}
	if err != nil {
		s.timer.Stop()
		rw.Close()
		if s.isExpired() {
			return nil, fmt.Errorf("session at %s: no answer within %v", c.gateway, timeout)
		}
		return nil, fmt.Errorf("session at %s: read first event: %w", c.gateway, err)
	}
	s.hb = time.Duration(s.First.Heartbeat)
	if s.hb <= 0 {
		s.hb = DefaultWatchHeartbeat
	}
	s.last.Store(time.Now().UnixNano())
	s.timer.Reset(WatchMissedHeartbeats * s.hb)
	go s.read(br)
	return s, nil
}

// silent closes the connection of a session the gateway has not written to
// for too long.
func (s *Session) silent() {
	s.mu.Lock()
	s.expired = true
	s.mu.Unlock()
	s.rw.Close()
}

func (s *Session) isExpired() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expired
}

// read reads the gateway's lines until the session ends: replies go to
// their requests, events that carry more than a heartbeat to Next.
func (s *Session) read(br *bufio.Reader) {
	var err error
	defer func() {
		s.timer.Stop()
		s.rw.Close()
		s.mu.Lock()
		switch {
		case s.expired:
			err = fmt.Errorf("%w: no heartbeat from the gateway for %v", ErrWatchSilent, WatchMissedHeartbeats*s.hb)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			err = errors.New("gateway closed the connection")
		}
		s.err = err
		for id, ch := range s.pending {
			close(ch)
			delete(s.pending, id)
		}
		s.mu.Unlock()
		close(s.done)
	}()
	for {
		var line []byte
		if line, err = readLine(br, maxResponseSize); err != nil {
			return
		}
		var ev WatchEvent
		if err = json.Unmarshal(line, &ev); err != nil {
			err = fmt.Errorf("session at %s: bad event: %w", s.c.gateway, err)
			return
		}
		s.timer.Reset(WatchMissedHeartbeats * s.hb)
		s.last.Store(time.Now().UnixNano())
		switch {
		case ev.Ended != nil:
			err = fmt.Errorf("session: %w", &APIError{Status: http.StatusGone, Code: ev.Ended.Code, Message: ev.Ended.Message})
			return
		case ev.Reply != nil:
			s.mu.Lock()
			ch := s.pending[ev.Reply.ID]
			delete(s.pending, ev.Reply.ID)
			s.mu.Unlock()
			if ch != nil {
				ch <- *ev.Reply
			}
		case ev.Bypass != nil:
			select {
			case s.events <- ev:
			case <-time.After(s.hb):
				// Nobody reads events: keep answering requests.
			}
		}
	}
}

// Next waits for the next event that carries more than a heartbeat (a
// changed site-local bypass). It returns an error when the session ends:
// the gateway stopped or closed it, the lease ended (the error matches
// ErrLeaseEnded and says why), or no heartbeat came for three intervals
// (ErrWatchSilent).
func (s *Session) Next() (WatchEvent, error) {
	if s.w != nil {
		for {
			ev, err := s.w.Next()
			if err != nil || ev.Bypass != nil {
				return ev, err
			}
		}
	}
	select {
	case ev := <-s.events:
		return ev, nil
	case <-s.done:
		return WatchEvent{}, s.err
	}
}

// Done returns a channel that is closed when the session has ended (nil
// for a watch, whose end Next reports).
func (s *Session) Done() <-chan struct{} { return s.done }

// Legacy reports whether the gateway predates lease sessions: the lease is
// kept through a watch and separate requests, on two connections.
func (s *Session) Legacy() bool { return s.w != nil }

// LastEvent returns when the gateway's last line arrived.
func (s *Session) LastEvent() time.Time {
	if s.w != nil {
		return s.w.LastEvent()
	}
	return time.Unix(0, s.last.Load())
}

// Renew extends the lease and reports the client's bypass counters
// (req.LeaseRef is the session's and need not be set).
func (s *Session) Renew(ctx context.Context, req RenewRequest) (RenewResponse, error) {
	if s.w != nil {
		req.LeaseRef = s.ref
		return s.c.RenewReport(ctx, req)
	}
	r, err := s.request(ctx, SessionRequest{Op: OpRenew, Bypass: req.Bypass, Bearer: req.Bearer})
	if err != nil {
		return RenewResponse{}, fmt.Errorf("renew at %s: %w", s.c.gateway, err)
	}
	return RenewResponse{Expires: r.Expires}, nil
}

// Release frees the lease at once and ends the session.
func (s *Session) Release(ctx context.Context) error {
	if s.w != nil {
		s.w.Close()
		return s.c.Release(ctx, s.ref)
	}
	defer s.Close()
	if _, err := s.request(ctx, SessionRequest{Op: OpRelease}); err != nil {
		return fmt.Errorf("release at %s: %w", s.c.gateway, err)
	}
	return nil
}

// request sends req and waits for its reply.
func (s *Session) request(ctx context.Context, req SessionRequest) (SessionReply, error) {
	ch := make(chan SessionReply, 1)
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		return SessionReply{}, s.err
	default:
	}
	s.nextID++
	req.ID = s.nextID
	s.pending[req.ID] = ch
	s.mu.Unlock()
	s.wmu.Lock()
	_, err := s.rw.Write(marshalLine(req))
	s.wmu.Unlock()
	if err != nil {
		return SessionReply{}, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return SessionReply{}, s.err
		}
		if r.Error != nil {
			return r, &APIError{Status: statusOf(r.Error.Code), Code: r.Error.Code, Message: r.Error.Message}
		}
		return r, nil
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, req.ID)
		s.mu.Unlock()
		return SessionReply{}, ctx.Err()
	}
}

// statusOf is the HTTP status of code in the refusals table.
func statusOf(code string) int {
	for _, r := range refusals {
		if r.code == code {
			return r.status
		}
	}
	return http.StatusBadRequest
}

// Close ends the session without releasing the lease.
func (s *Session) Close() {
	if s.w != nil {
		s.w.Close()
		return
	}
	s.timer.Stop()
	s.rw.Close()
	<-s.done
}
