// SPDX-License-Identifier: MIT

package control_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestSession checks a job's whole life over one connection: join, the
// session's first event and heartbeats, renewals, the release; the gateway
// accepts exactly one TCP connection for all of it.
func TestSession(t *testing.T) {
	b := &controltest.Backend{Instance: "abc123"}
	gw := controltest.Start(t, b, controltest.Options{WatchHeartbeat: 100 * time.Millisecond})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: lease.ID, Secret: lease.Secret}
	s, err := c.Attach(ctx, ref)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if s.Legacy() {
		t.Fatal("Attach fell back to a watch on a gateway with sessions")
	}
	if s.First.Instance != "abc123" || time.Duration(s.First.Heartbeat) != 100*time.Millisecond {
		t.Errorf("first event %+v, want instance abc123, heartbeat 100ms", s.First)
	}
	for i := 0; i < 3; i++ {
		before := s.LastEvent()
		if !topology.Poll(150*time.Millisecond, func() bool { return s.LastEvent().After(before) }) {
			t.Fatalf("no heartbeat within 150 ms (interval 100 ms)")
		}
		resp, err := s.Renew(ctx, control.RenewRequest{})
		if err != nil {
			t.Fatalf("renew %d: %v", i, err)
		}
		if resp.Expires.Before(time.Now()) {
			t.Errorf("renew %d: expires %v, in the past", i, resp.Expires)
		}
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := s.Next(); err == nil {
		t.Error("session still open after the release")
	}
	if n := gw.Conns.Load(); n != 1 {
		t.Errorf("the gateway accepted %d connections for join, session, renewals and release, want 1", n)
	}
	want := []string{"join", "renew", "renew", "renew", "release"}
	if got := b.Calls(); !slices.Equal(got, want) {
		t.Errorf("backend calls %v, want %v", got, want)
	}
	if _, err := c.Attach(ctx, ref); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("session of a released lease: got %v, want ErrUnknownLease", err)
	}
}

// TestSessionLegacyGateway checks that Attach falls back to a lease watch
// and separate requests with a gateway that predates sessions.
func TestSessionLegacyGateway(t *testing.T) {
	b := &controltest.Backend{Instance: "old"}
	gw := controltest.Start(t, b, controltest.Options{WatchHeartbeat: 100 * time.Millisecond})
	control.DisableSessions(gw.Server)
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Attach(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if !s.Legacy() || s.First.Instance != "old" {
		t.Fatalf("Attach to an old gateway: legacy %v, first %+v; want a watch", s.Legacy(), s.First)
	}
	if _, err := s.Renew(ctx, control.RenewRequest{}); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	want := []string{"join", "renew", "release"}
	if got := b.Calls(); !slices.Equal(got, want) {
		t.Errorf("backend calls %v, want %v", got, want)
	}
}

// TestSessionEnds checks how a session ends: at once when the gateway
// shuts down; with ErrLeaseEnded and the reason when the gateway ends the
// lease on purpose (long before the next heartbeat); a renewal of a lease
// the gateway no longer knows answers ErrUnknownLease.
func TestSessionEnds(t *testing.T) {
	b := &controltest.Backend{}
	gw := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Minute})
	c := newClient(t, gw)
	ctx := context.Background()
	attach := func() (*control.Session, control.Lease) { return joinAttach(t, c, gw) }

	s, lease := attach()
	b.End(lease.ID, "kicked by admin: abuse report")
	t0 := time.Now()
	gw.Server.WakeWatches(lease.ID)
	_, err := s.Next()
	if !errors.Is(err, control.ErrLeaseEnded) || !strings.Contains(err.Error(), "abuse report") {
		t.Errorf("session ended with %v, want ErrLeaseEnded with the reason", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("session told of the end after %v, want at once", d)
	}
	s.Close()

	s, lease = attach()
	b.SetRenewErr(fmt.Errorf("%w: gone", control.ErrUnknownLease))
	if _, err := s.Renew(ctx, control.RenewRequest{}); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("renewal of an unknown lease: got %v, want ErrUnknownLease", err)
	}
	b.SetRenewErr(nil)

	t0 = time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := gw.Server.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := s.Next(); err == nil {
		t.Fatal("session still open after shutdown")
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("session ended %v after shutdown, want at once", d)
	}
	if _, err := s.Renew(ctx, control.RenewRequest{}); err == nil {
		t.Error("renewal on an ended session succeeded")
	}
}

// joinAttach joins gw through c with a token of its own and opens the
// lease's session.
func joinAttach(t *testing.T, c *control.Client, gw *controltest.Gateway) (*control.Session, control.Lease) {
	t.Helper()
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Attach(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret})
	if err != nil {
		t.Fatal(err)
	}
	return s, lease
}

// TestShutdownClosesListenerFirst: a job whose session a stopping gateway
// ends finds the control port closed when it dials again at once. The
// listener stayed open while the sessions closed, so a 10,000-job gateway
// spent its stop on 10,000 new TLS handshakes (more than 30 s).
func TestShutdownClosesListenerFirst(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{WatchHeartbeat: time.Minute})
	c := newClient(t, gw)
	ctx := context.Background()
	const jobs = 300
	redials := make(chan error, jobs)
	for range jobs {
		s, _ := joinAttach(t, c, gw)
		go func() {
			defer s.Close()
			for {
				if _, err := s.Next(); err != nil {
					break
				}
			}
			conn, err := net.DialTimeout("tcp", gw.Addr, 2*time.Second)
			if err == nil {
				conn.Close()
			}
			redials <- err
		}()
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := gw.Server.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for range jobs {
		if err := <-redials; err == nil {
			t.Fatal("a job whose session ended at shutdown connected again: the control port was still open")
		}
	}
}

// TestSessionSilent checks that a client gives up on a session that hears
// nothing for three heartbeats.
func TestSessionSilent(t *testing.T) {
	b := &controltest.Backend{}
	gw := controltest.Start(t, b, controltest.Options{WatchHeartbeat: 100 * time.Millisecond})
	c := newClient(t, gw)
	s, _ := joinAttach(t, c, gw)
	defer s.Close()
	b.Block() // the gateway stops answering: heartbeats stall
	defer b.Unblock()
	t0 := time.Now()
	if _, err := s.Next(); !errors.Is(err, control.ErrWatchSilent) {
		t.Errorf("got %v, want ErrWatchSilent", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("silence noticed after %v, want about 300 ms", d)
	}
}

// TestSessionBadRequests sends malformed lines on a session: each gets a
// bad_request reply and the session stays usable; a session upgrade
// without a lease is refused.
func TestSessionBadRequests(t *testing.T) {
	lease, conn, br := rawSessionConn(t)
	upgrade := func(id, secret string) *http.Response {
		t.Helper()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\n%s: %s\r\n\r\n",
			control.PathSession, control.SessionProtocol, control.HeaderLeaseID, id, control.HeaderLeaseSecret, secret)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := upgrade(lease.ID, "wrong"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("upgrade with a wrong secret: %s, want 404", resp.Status)
	} else {
		resp.Body.Close()
	}
	if resp := upgrade(lease.ID, lease.Secret); resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	if _, err := br.ReadString('\n'); err != nil { // the first event
		t.Fatal(err)
	}
	for _, line := range []string{
		`not json`,
		`{"id":1,"op":"dance"}`,
		`{"id":2,"op":"renew","extra":1}`,
		`{"id":3,"op":"renew","bypass":[{"rule":""}]}`,
		`{"id":4,"op":"release","bypass":[{"rule":"x"}]}`,
		`{"id":5,"op":"renew"}`,
	} {
		fmt.Fprintf(conn, "%s\n", line)
		reply, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		ok := strings.Contains(reply, `"reply"`) && !strings.Contains(reply, `"error"`)
		if want := strings.Contains(line, `"id":5`); ok != want {
			t.Errorf("%s: reply %s", line, reply)
		}
		if !ok && !strings.Contains(reply, control.CodeBadRequest) {
			t.Errorf("%s: reply %s, want bad_request", line, reply)
		}
	}
}

// TestIdleSessionsHoldNoGoroutine opens many sessions: idle, none of them
// holds a goroutine at the gateway (they wait in the idle waiter); each
// still answers its renewals, twice in a row (the waiter is armed again),
// and a session whose client goes away is closed.
func TestIdleSessionsHoldNoGoroutine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the idle waiter is epoll")
	}
	gw := controltest.Start(t, nil, controltest.Options{WatchHeartbeat: time.Minute})
	ctx := context.Background()
	const n = 40
	var sessions []*control.Session
	for i := 0; i < n; i++ {
		c := newClient(t, gw)
		req := joinReq(gw.Token(t))
		req.PublicKey[0] = byte(i)
		lease, err := c.Join(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		s, err := c.Attach(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret})
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, s)
	}
	serverGoroutines := func() int {
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 2)
		return strings.Count(b.String(), "(*serverSession).serve") + strings.Count(b.String(), "(*serverSession).readable")
	}
	// The sessions go idle once their joins are answered.
	if !topology.Poll(2*time.Second, func() bool { return serverGoroutines() == 0 }) {
		t.Errorf("%d idle sessions hold %d goroutines at the gateway, want none", n, serverGoroutines())
	}
	for round := 0; round < 2; round++ {
		for i, s := range sessions {
			if _, err := s.Renew(ctx, control.RenewRequest{}); err != nil {
				t.Fatalf("round %d: renewal on session %d: %v", round, i, err)
			}
		}
	}
	if !topology.Poll(2*time.Second, func() bool { return serverGoroutines() == 0 }) {
		t.Errorf("after the renewals, %d goroutines at the gateway, want none", serverGoroutines())
	}
	before := gw.Server.Sessions()
	sessions[0].Close()
	if !topology.Poll(5*time.Second, func() bool { return gw.Server.Sessions() == before-1 }) {
		t.Fatalf("a session whose client went away still open: %d sessions, want %d", gw.Server.Sessions(), before-1)
	}
	for _, s := range sessions[1:] {
		s.Close()
	}
}

// TestSessionRequestsBounded (issue 33, item 6): a lease session carries a
// bounded rate of requests: a flood over it is answered rate_limited
// without reaching the backend, and a flood that goes on ends the session.
func TestSessionRequestsBounded(t *testing.T) {
	lease, conn, br := rawSessionConn(t)
	upgradeSession(t, conn, br, lease)
	limited, ended := 0, false
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	for i := 0; i < 400 && !ended; i++ {
		if _, err := fmt.Fprintf(conn, "{\"id\":%d,\"op\":\"renew\"}\n", i+1); err != nil {
			ended = true
			break
		}
		reply, err := br.ReadString('\n')
		if err != nil {
			ended = true
			break
		}
		if strings.Contains(reply, control.CodeRateLimited) {
			limited++
		}
	}
	if limited < 50 || !ended {
		t.Errorf("a flood of 400 renewals over one session: %d rate_limited, session ended %v; want most limited and the session ended", limited, ended)
	}
}

// rawSessionConn joins a gateway (heartbeats a minute apart) and opens a
// TLS connection to its control port on which a test writes a session
// upgrade and session lines by hand; the connection closes with the test.
func rawSessionConn(t *testing.T) (control.Lease, *tls.Conn, *bufio.Reader) {
	t.Helper()
	gw := controltest.Start(t, nil, controltest.Options{WatchHeartbeat: time.Minute})
	lease, err := newClient(t, gw).Join(context.Background(), joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	conn, br := rawConn(t, gw)
	return lease, conn, br
}

// rawConn opens a TLS connection to gw's control port that closes with
// the test.
func rawConn(t *testing.T, gw *controltest.Gateway) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := tls.Dial("tcp", gw.Addr, control.ClientTLSConfig(gw.Pin))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

// upgradeSession writes lease's session upgrade on conn and reads the
// 101 and the first event.
func upgradeSession(t *testing.T, conn *tls.Conn, br *bufio.Reader, lease control.Lease) {
	t.Helper()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\n%s: %s\r\n%s: %s\r\n\r\n",
		control.PathSession, control.SessionProtocol, control.HeaderLeaseID, lease.ID, control.HeaderLeaseSecret, lease.Secret)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if _, err := br.ReadString('\n'); err != nil { // the first event
		t.Fatal(err)
	}
}

// TestSessionRequestsPerSource (issue 33, item 6): the lease sessions of
// one source share a request budget, so that many leases do not multiply
// a host's session budget; a session that was quiet (a renewal, as
// clients send them) is never refused for its neighbours' flood.
func TestSessionRequestsPerSource(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{WatchHeartbeat: time.Minute})
	control.SetSourceRequestLimit(gw.Server, 0.1, 10)
	tok := gw.Token(t)
	type session struct {
		conn *tls.Conn
		br   *bufio.Reader
	}
	var ss []session
	for i := range 3 {
		req := joinReq(tok)
		req.Job.BatchJobID = fmt.Sprint(100 + i)
		lease, err := newClient(t, gw).Join(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		conn, br := rawConn(t, gw)
		upgradeSession(t, conn, br, lease)
		conn.SetDeadline(time.Now().Add(20 * time.Second))
		ss = append(ss, session{conn, br})
	}
	renew := func(s session, id int) string {
		t.Helper()
		if _, err := fmt.Fprintf(s.conn, "{\"id\":%d,\"op\":\"renew\"}\n", id); err != nil {
			t.Fatal(err)
		}
		reply, err := s.br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	// Two sessions, 8 requests each: within each session's own budget
	// (burst 20), over the source's (burst 10).
	bySource := 0
	for i := range 16 {
		if strings.Contains(renew(ss[i%2], i+1), "lease sessions of this source") {
			bySource++
		}
	}
	if bySource < 4 {
		t.Errorf("16 requests over two sessions of one source with a shared burst of 10: %d refused for the source's budget, want at least 4", bySource)
	}
	time.Sleep(1100 * time.Millisecond) // the third session's quiet spell
	if reply := renew(ss[2], 99); strings.Contains(reply, "rate_limited") {
		t.Errorf("a quiet session's renewal refused for its neighbours' flood: %s", reply)
	}
}
