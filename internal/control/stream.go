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
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// The control port carries two long-lived exchanges besides the JSON
// requests:
//
//   - The TCP transport (PathTunnel): a GET with "Connection: Upgrade" and
//     "Upgrade: airlock-wireguard/1" whose lease headers authenticate it is
//     answered "101 Switching Protocols"; from then on the TLS connection
//     carries WireGuard messages in frames (internal/tunnel, AppendFrame)
//     both ways. One stream per lease; a new one replaces the old.
//   - The lease watch (PathWatch): a POST of a LeaseRef answered with a
//     stream of newline-delimited WatchEvent objects, one at once and one
//     per heartbeat, for as long as the lease lives and the gateway runs.
//     A client learns that its gateway went away from the end of this
//     stream, at once when the gateway process stops, within three
//     heartbeats (WatchMissedHeartbeats) when the network fails silently.
//     When the gateway ends the lease on purpose (kick, token revoked), it
//     wakes the lease's watches (Server.WakeWatches): their last event
//     carries Ended, so the client learns why at once, not at its next
//     renewal.

// Paths of the long-lived control exchanges.
const (
	PathTunnel = "/" + Version + "/tunnel"
	PathWatch  = "/" + Version + "/watch"
)

// TunnelProtocol is the Upgrade token of the TCP transport.
const TunnelProtocol = "airlock-wireguard/1"

// Headers that name the lease of a tunnel upgrade.
const (
	HeaderLeaseID     = "Airlock-Lease-Id"
	HeaderLeaseSecret = "Airlock-Lease-Secret"
)

// DefaultWatchHeartbeat is how often a watch sends a heartbeat. A client
// gives up on a watch after WatchMissedHeartbeats intervals of silence.
const DefaultWatchHeartbeat = 5 * time.Second

// WatchMissedHeartbeats is how many heartbeat intervals may pass without
// an event before a client considers the gateway lost.
const WatchMissedHeartbeats = 3

// WatchEvent is one line of a lease watch.
type WatchEvent struct {
	// Instance is the gateway's Health.Instance.
	Instance string `json:"instance"`
	// Heartbeat is the interval of the following events.
	Heartbeat Duration `json:"heartbeat"`
	// Ended, set in a watch's last event only, says that the gateway
	// ended the lease on purpose and why (Code is CodeLeaseEnded).
	Ended *ErrorResponse `json:"ended,omitempty"`
	// Bypass, when set, is the lease's site-local bypass as of now: in
	// the first event, and in one sent when a reload changed it.
	Bypass *Bypass `json:"bypass,omitempty"`
	// Reply, on a lease session only (session.go), answers one of the
	// client's requests; such an event is not a heartbeat of its own.
	Reply *SessionReply `json:"reply,omitempty"`
	// Resume, in the first event only, is set when the gateway will start
	// the WireGuard handshake with this job itself (it restarted and
	// knows the job's endpoint; Backend.HandshakeDue): the client waits
	// that long for it before it starts one, so that thousands of jobs
	// do not handshake at once.
	Resume Duration `json:"resume,omitempty"`
}

// upgradeRef checks an upgrade request (the tunnel's, a lease session's)
// for protocol and returns the lease it names in its headers; it answers
// the request and returns false if the request is malformed.
func (s *Server) upgradeRef(w http.ResponseWriter, r *http.Request, lim limit, op string, remote netip.AddrPort, protocol string) (LeaseRef, bool) {
	if !headerHas(r.Header, "Connection", "upgrade") || r.Header.Get("Upgrade") != protocol {
		s.leaseError(w, r, lim, op, remote, fmt.Errorf("%w: %s request without Upgrade: %s", ErrBadRequest, op, protocol))
		return LeaseRef{}, false
	}
	ref := LeaseRef{ID: r.Header.Get(HeaderLeaseID), Secret: r.Header.Get(HeaderLeaseSecret), From: remote}
	if ref.ID == "" || ref.Secret == "" {
		s.leaseError(w, r, lim, op, remote, fmt.Errorf("%w: %s request without lease id or secret", ErrBadRequest, op))
		return LeaseRef{}, false
	}
	return ref, true
}

func (s *Server) handleTunnel(w http.ResponseWriter, r *http.Request) {
	remote := remoteAddr(r)
	if !s.checkMethod(w, r, http.MethodGet) {
		return
	}
	lim := s.limitOf(remote)
	ref, ok := s.upgradeRef(w, r, lim, "tunnel", remote, TunnelProtocol)
	if !ok {
		return
	}
	attach, err := s.backend.Tunnel(r.Context(), ref, remote)
	if errors.Is(err, ErrNotSupported) {
		writeError(w, http.StatusNotFound, CodeBadRequest, "this gateway does not offer the TCP transport; use --transport udp")
		return
	}
	if err != nil {
		s.leaseError(w, r, lim, "tunnel", remote, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		s.refuse(w, "tunnel", remote, errors.New("connection cannot be taken over"))
		return
	}
	c, rw, err := hj.Hijack()
	if err != nil {
		s.refuse(w, "tunnel", remote, fmt.Errorf("take over connection: %w", err))
		return
	}
	c.SetDeadline(time.Time{})
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + TunnelProtocol + "\r\nConnection: Upgrade\r\n\r\n")
	if err := rw.Flush(); err != nil {
		c.Close()
		s.log.Debug("tunnel upgrade", "remote", remote, "err", err)
		return
	}
	c.SetWriteDeadline(time.Time{})
	s.log.Debug("tunnel stream attached", "lease", ref.ID, "remote", remote)
	attach(withReader(c, rw.Reader))
}

func (s *Server) handleWatch(w http.ResponseWriter, r *http.Request) {
	remote := remoteAddr(r)
	if !s.checkMethod(w, r, http.MethodPost) {
		return
	}
	lim := s.limitOf(remote)
	ref, err := decodeLeaseRef(http.MaxBytesReader(w, r.Body, maxBodySize))
	if err != nil {
		s.leaseError(w, r, lim, "watch", remote, fmt.Errorf("%w: invalid watch request: %w", ErrBadRequest, err))
		return
	}
	ref.From = remote
	if err := s.backend.CheckLease(ref); err != nil {
		s.leaseError(w, r, lim, "watch", remote, err)
		return
	}
	wake, ok := s.watches.acquire(ref.ID)
	if !ok {
		// Not counted as a failure: a NATed site's other jobs share the
		// source address.
		writeError(w, http.StatusTooManyRequests, CodeRateLimited,
			fmt.Sprintf("more than %d watches of one lease; close the others", maxWatchesPerLease))
		return
	}
	defer s.watches.release(ref.ID)
	// Checked again once the wake channel is held, so that an end of the
	// lease between the first check and now is not missed.
	wakeUp := wake.wait()
	if err := s.backend.CheckLease(ref); err != nil {
		s.leaseError(w, r, lim, "watch", remote, err)
		return
	}
	rc := http.NewResponseController(w)
	// The watch outlives the server's read timeout, whose expiry would
	// cancel the request: a watch's liveness is its heartbeat instead.
	rc.SetReadDeadline(time.Time{})
	ev := WatchEvent{Instance: s.backend.Health().Instance, Heartbeat: Duration(s.watchHB)}
	heartbeat, _ := json.Marshal(ev)
	heartbeat = append(heartbeat, '\n')
	first := ev
	first.Resume = Duration(s.backend.HandshakeDue(ref))
	line := marshalLine(first)
	bypassChanged, withBypass := s.watchBypass(ref, first)
	if withBypass != nil {
		line = withBypass
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	t := time.NewTicker(s.watchHB)
	defer t.Stop()
	for {
		rc.SetWriteDeadline(time.Now().Add(s.watchHB))
		if _, err := w.Write(line); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		line = heartbeat
		select {
		case <-r.Context().Done():
			return
		case <-s.stop:
			return
		case <-t.C:
		case <-wakeUp:
		case <-bypassChanged:
			if bypassChanged, withBypass = s.watchBypass(ref, ev); withBypass != nil {
				line = withBypass
			}
		}
		wakeUp = wake.wait()
		if err := s.backend.CheckLease(ref); err != nil {
			s.log.Debug("watch ends: lease gone", "lease", ref.ID, "remote", remote, "err", err)
			if errors.Is(err, ErrLeaseEnded) {
				last, _ := json.Marshal(WatchEvent{Instance: ev.Instance, Heartbeat: ev.Heartbeat,
					Ended: &ErrorResponse{Code: CodeLeaseEnded, Message: err.Error()}})
				rc.SetWriteDeadline(time.Now().Add(s.watchHB))
				w.Write(append(last, '\n'))
				rc.Flush()
			}
			return
		}
	}
}

// watchBypass returns the watch event line that carries the lease's
// current bypass (nil if the backend offers none or the lease is gone) and
// the channel that says when it changes (nil: never).
func (s *Server) watchBypass(ref LeaseRef, ev WatchEvent) (<-chan struct{}, []byte) {
	b, changed, err := s.backend.LeaseBypass(ref)
	if err != nil {
		return nil, nil
	}
	if b == nil {
		b = &Bypass{}
	}
	ev.Bypass = b
	line, err := json.Marshal(ev)
	if err != nil {
		return changed, nil
	}
	return changed, append(line, '\n')
}

// maxWatchesPerLease bounds the watches one lease may hold open: a client
// needs one, a reconnecting client briefly two.
const maxWatchesPerLease = 4

// watchCounts counts open watches per lease and wakes them. It is safe
// for concurrent use; the zero value is ready.
type watchCounts struct {
	mu sync.Mutex
	m  map[string]*watchWaker // guarded by mu
}

// watchWaker is the shared state of one lease's watches.
type watchWaker struct {
	n  int           // guarded by watchCounts.mu
	mu sync.Mutex    // guards ch
	ch chan struct{} // closed (and replaced) by wakeUp
}

// wait returns a channel closed at the next wakeUp.
func (w *watchWaker) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ch
}

func (w *watchWaker) wakeUp() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.ch)
	w.ch = make(chan struct{})
}

func (c *watchCounts) acquire(id string) (*watchWaker, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*watchWaker{}
	}
	w := c.m[id]
	if w == nil {
		w = &watchWaker{ch: make(chan struct{})}
		c.m[id] = w
	}
	if w.n >= maxWatchesPerLease {
		return nil, false
	}
	w.n++
	return w, true
}

func (c *watchCounts) release(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.m[id]; w != nil {
		if w.n--; w.n <= 0 {
			delete(c.m, id)
		}
	}
}

func (c *watchCounts) wake(id string) {
	c.mu.Lock()
	w := c.m[id]
	c.mu.Unlock()
	if w != nil {
		w.wakeUp()
	}
}

// WakeWatches makes the open watches and sessions of lease id check it at
// once: when
// the Backend's CheckLease then returns ErrLeaseEnded, the watch sends a
// last event with Ended and closes. The gateway calls it when it ends a
// lease on purpose. It does not block.
func (s *Server) WakeWatches(id string) {
	s.watches.wake(id)
	for _, ss := range s.sessions.of(id) {
		go ss.tick()
	}
}

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range bytes.Split([]byte(v), []byte(",")) {
			if string(bytes.ToLower(bytes.TrimSpace(t))) == token {
				return true
			}
		}
	}
	return false
}

// bufConn is a net.Conn whose first reads come from a bufio.Reader that
// already holds some of its bytes.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func withReader(c net.Conn, r *bufio.Reader) net.Conn {
	if r == nil || r.Buffered() == 0 {
		return c
	}
	return bufConn{Conn: c, r: r}
}

// DialTunnel opens the TCP transport for the lease ref: a new TLS
// connection to the gateway, pinned, upgraded to carry WireGuard frames.
// It returns the connection and the gateway's address as dialled.
func (c *Client) DialTunnel(ctx context.Context, ref LeaseRef) (net.Conn, netip.AddrPort, error) {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	raw, err := c.dial(ctx, "tcp", c.gateway)
	if err != nil {
		return nil, netip.AddrPort{}, c.transportError(ctx, "tunnel", err, false)
	}
	remote, _ := netip.ParseAddrPort(raw.RemoteAddr().String())
	remote = netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	tc := tls.Client(raw, c.tlsConf.Clone())
	if dl, ok := ctx.Deadline(); ok {
		tc.SetDeadline(dl)
	}
	fail := func(err error) (net.Conn, netip.AddrPort, error) {
		tc.Close()
		return nil, netip.AddrPort{}, err
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return fail(c.transportError(ctx, "tunnel", err, true))
	}
	req, err := http.NewRequest(http.MethodGet, c.base+PathTunnel, nil)
	if err != nil {
		return fail(fmt.Errorf("tunnel: %w", err))
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", TunnelProtocol)
	req.Header.Set(HeaderLeaseID, ref.ID)
	req.Header.Set(HeaderLeaseSecret, ref.Secret)
	if err := req.Write(tc); err != nil {
		return fail(fmt.Errorf("tunnel at %s: send upgrade: %w", c.gateway, err))
	}
	br := bufio.NewReaderSize(tc, 64<<10)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(fmt.Errorf("tunnel at %s: read upgrade answer: %w", c.gateway, err))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return fail(fmt.Errorf("tunnel at %s: %w", c.gateway, readAPIError(resp)))
	}
	tc.SetDeadline(time.Time{})
	return withReader(tc, br), remote, nil
}

// Watch is an open lease watch. Create it with Client.Watch. It is safe
// for concurrent use.
type Watch struct {
	// First is the event the gateway sent at once.
	First WatchEvent

	body  io.ReadCloser
	dec   *json.Decoder
	timer *time.Timer
	hb    time.Duration

	mu      sync.Mutex
	expired bool // guarded by mu: the heartbeat timer closed body

	lastEvent time.Time // set by the goroutine that calls Next
}

// Watch opens a watch of the lease ref and reads its first event.
func (c *Client) Watch(ctx context.Context, ref LeaseRef) (*Watch, error) {
	body, err := json.Marshal(ref)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+PathWatch, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header["Idempotency-Key"] = nil
	timeout := c.timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	w := &Watch{}
	// The first event must come within the client's timeout; later ones
	// within three heartbeats.
	var resp *http.Response
	w.timer = time.AfterFunc(timeout, func() {
		w.mu.Lock()
		w.expired = true
		if w.body != nil {
			w.body.Close()
		}
		w.mu.Unlock()
	})
	resp, err = c.watchHTTP.Do(req)
	if err != nil {
		w.timer.Stop()
		return nil, c.transportError(ctx, "watch", err, !isDialError(err))
	}
	if resp.StatusCode != http.StatusOK {
		w.timer.Stop()
		defer resp.Body.Close()
		return nil, fmt.Errorf("watch at %s: %w", c.gateway, readAPIError(resp))
	}
	w.mu.Lock()
	w.body = resp.Body
	expired := w.expired
	w.mu.Unlock()
	if expired {
		resp.Body.Close()
		return nil, fmt.Errorf("watch at %s: no answer within %v", c.gateway, timeout)
	}
	w.dec = json.NewDecoder(resp.Body)
	if err := w.dec.Decode(&w.First); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch at %s: read first event: %w", c.gateway, err)
	}
	w.hb = time.Duration(w.First.Heartbeat)
	if w.hb <= 0 {
		w.hb = DefaultWatchHeartbeat
	}
	w.timer.Reset(WatchMissedHeartbeats * w.hb)
	w.lastEvent = time.Now()
	return w, nil
}

// isDialError reports whether err happened while connecting.
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// Next waits for the next event. It returns an error when the watch ends:
// the gateway stopped or closed it, the lease ended, or no heartbeat came
// for three intervals.
func (w *Watch) Next() (WatchEvent, error) {
	var ev WatchEvent
	if err := w.dec.Decode(&ev); err != nil {
		w.mu.Lock()
		expired := w.expired
		w.mu.Unlock()
		if expired {
			return ev, fmt.Errorf("%w: no heartbeat from the gateway for %v", ErrWatchSilent, WatchMissedHeartbeats*w.hb)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return ev, errors.New("gateway closed the connection")
		}
		return ev, err
	}
	if ev.Ended != nil {
		return ev, fmt.Errorf("watch: %w", &APIError{Status: http.StatusGone, Code: ev.Ended.Code, Message: ev.Ended.Message})
	}
	w.timer.Reset(WatchMissedHeartbeats * w.hb)
	w.lastEvent = time.Now()
	return ev, nil
}

// LastEvent returns when the last event arrived. Call it from the
// goroutine that calls Next, or after Next returned.
func (w *Watch) LastEvent() time.Time { return w.lastEvent }

// Close ends the watch.
func (w *Watch) Close() {
	w.timer.Stop()
	w.mu.Lock()
	if w.body != nil {
		w.body.Close()
	}
	w.mu.Unlock()
}
