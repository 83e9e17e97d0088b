// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/internal/syncbuf"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"github.com/airlock-vpn/airlock/test/topology"
)

// testSession joins the in-process gateway g and starts WireGuard on a
// channel TUN (no packets flow: the gateway is only a control server).
func testSession(t *testing.T, g *controltest.Gateway, stderr *syncbuf.Buffer) *Session {
	t.Helper()
	s := newTestSession(t, g, stderr, 5*time.Second)
	ctx := context.Background()
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	s.lease.RenewInterval = control.Duration(50 * time.Millisecond)
	if err := s.StartTunnel(ctx, tuntest.NewChannelTUN().TUN()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// newTestSession is a session with g, not joined yet, that waits at most
// joinTimeout for it.
func newTestSession(t *testing.T, g *controltest.Gateway, stderr *syncbuf.Buffer, joinTimeout time.Duration) *Session {
	t.Helper()
	gws, err := ParseGateways(g.Addr, g.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	var w io.Writer = io.Discard
	if stderr != nil {
		w = stderr
	}
	s := NewSession(SessionConfig{Logger: slog.New(slog.DiscardHandler), Stderr: w, Gateways: gws, Key: priv,
		Join:      control.JoinRequest{Token: g.Token(t)},
		Transport: TransportUDP, TransportTimeout: time.Second, FailoverAfter: time.Second, JoinTimeout: joinTimeout})
	s.warnAfter = 10 * time.Millisecond
	t.Cleanup(s.closeClients)
	return s
}

// TestSessionLeaseGone checks that a lease the gateway ended (kick), or
// forgot while refusing a new one, is reported on stderr once, loudly,
// with the gateway's reason, and that the session stops reconnecting
// (the job keeps running without network).
func TestSessionLeaseGone(t *testing.T) {
	for _, c := range []struct {
		name     string
		renewErr error
		revoke   bool // revoke the token, so that joining again fails
		want     []string
	}{
		{"kicked", fmt.Errorf("%w: ended by the gateway's admin (airlock kick): maintenance", control.ErrLeaseEnded), false,
			[]string{"THE GATEWAY ENDED THIS JOB'S LEASE", "airlock kick): maintenance", "network through the gateway is cut"}},
		{"unknown", fmt.Errorf("%w: no such lease", control.ErrUnknownLease), true,
			[]string{"NO LONGER KNOWS THIS JOB'S LEASE", "token rejected", "network through the gateway is cut"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &controltest.Backend{}
			g := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Second})
			var stderr syncbuf.Buffer
			s := testSession(t, g, &stderr)
			b.SetRenewErr(c.renewErr)
			if c.revoke {
				toks, err := g.Store.Tokens()
				if err != nil {
					t.Fatal(err)
				}
				for _, tok := range toks {
					if err := g.Store.RevokeToken(tok.Name); err != nil {
						t.Fatal(err)
					}
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan struct{})
			go func() { defer close(done); s.Supervise(ctx) }()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("session did not stop after the lease was gone")
			}
			out := stderr.String()
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("stderr %q: want %q", out, w)
				}
			}
			if n := strings.Count(out, "airlock: THE GATEWAY"); n != 1 {
				t.Errorf("message printed %d times, want once", n)
			}
		})
	}
}

// TestSessionRejoins checks that a lease the gateway forgot is joined
// again when the gateway takes the job, without any message.
func TestSessionRejoins(t *testing.T) {
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Second})
	var stderr syncbuf.Buffer
	s := testSession(t, g, &stderr)
	first := s.lease.ID
	b.SetRenewErr(fmt.Errorf("%w: no such lease", control.ErrUnknownLease))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Supervise(ctx) }()
	if !topology.Poll(5*time.Second, func() bool { return countOf(b.Calls(), "join") >= 2 }) {
		t.Fatalf("no second join after the lease was forgotten: calls %v", b.Calls())
	}
	b.SetRenewErr(nil)
	cancel()
	<-done
	if s.lease.ID == first {
		t.Errorf("session kept the forgotten lease %s", first)
	}
	if out := stderr.String(); out != "" {
		t.Errorf("stderr %q, want nothing", out)
	}
}

func countOf(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// TestJoinWaitsOutRateLimit checks that a join refused because the node's
// address is rate-limited (a neighbour's failed joins) is retried after
// the gateway's Retry-After instead of failing the job at start.
func TestJoinWaitsOutRateLimit(t *testing.T) {
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{FailureLimit: 1, FailureBurst: 1})
	var stderr syncbuf.Buffer
	s := newTestSession(t, g, &stderr, 10*time.Second)
	ctx := context.Background()
	// The neighbour: bad-token joins from the same address until limited.
	priv, _ := wgkey.Generate()
	limited := false
	for i := 0; i < 5 && !limited; i++ {
		_, err := s.gws[0].cc.Join(ctx, control.JoinRequest{Token: "alk1_nope", PublicKey: priv.PublicKey()})
		limited = errors.Is(err, control.ErrRateLimited)
	}
	if !limited {
		t.Fatal("the bad joins were never rate-limited: the test cannot show the wait")
	}
	start := time.Now()
	if err := s.Join(ctx); err != nil {
		t.Fatalf("join from a rate-limited address: %v, want it to wait and succeed", err)
	}
	t.Logf("joined after %v", time.Since(start).Round(time.Millisecond))
	if out := stderr.String(); strings.Count(out, "waiting for it") != 1 || !strings.Contains(out, "rate_limited") {
		t.Errorf("stderr %q: want one line saying it waits, with the gateway's reason", out)
	}
}

// TestJoinWaits checks which refusals a job waits out (the gateway named a
// Retry-After: busy, draining, a quota; or it does not answer) and which
// end its start at once (bad token, ban, a full gateway); and that a wait
// ends at the join timeout with the gateway's last answer.
func TestJoinWaits(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error // the backend's join error, until cleared
		wait bool  // the session waits it out
	}{
		{"busy", control.WithRetryAfter(control.ErrBusy, time.Second), true},
		{"draining", control.WithRetryAfter(fmt.Errorf("%w: airlock gateway drain", control.ErrDraining), time.Second), true},
		{"quota", control.WithRetryAfter(fmt.Errorf("%w: joins_per_minute = 2", control.ErrQuota), time.Second), true},
		{"internal", control.WithRetryAfter(errors.New("disk full"), time.Second), true},
		{"full", fmt.Errorf("%w: all 4 port blocks are in use", control.ErrNoAddress), false},
		{"banned", fmt.Errorf("%w: until tomorrow", control.ErrBanned), false},
		{"bad request", fmt.Errorf("%w: expose 22: no rule", control.ErrBadRequest), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := &controltest.Backend{}
			g := controltest.Start(t, b, controltest.Options{})
			b.SetJoinErr(c.err)
			var stderr syncbuf.Buffer
			s := newTestSession(t, g, &stderr, 20*time.Second)
			done := make(chan error, 1)
			t0 := time.Now()
			go func() { done <- s.Join(context.Background()) }()
			select {
			case err := <-done:
				if c.wait {
					t.Fatalf("join ended at once with %v, want it to wait", err)
				}
				if err == nil || time.Since(t0) > 5*time.Second {
					t.Errorf("join: %v after %v, want a refusal at once", err, time.Since(t0))
				}
				if stderr.String() != "" {
					t.Errorf("stderr %q: want nothing (the caller reports the refusal)", stderr.String())
				}
				return
			case <-time.After(1500 * time.Millisecond):
				if !c.wait {
					t.Fatal("join still waiting after 1.5 s, want a definite refusal")
				}
			}
			b.SetJoinErr(nil)
			if err := <-done; err != nil {
				t.Fatalf("join after the refusal cleared: %v", err)
			}
			if out := stderr.String(); strings.Count(out, "waiting for it") != 1 || !strings.Contains(out, "joined gateway") {
				t.Errorf("stderr %q: want one line saying it waits and one that it joined", out)
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		b := &controltest.Backend{}
		g := controltest.Start(t, b, controltest.Options{})
		b.SetJoinErr(control.WithRetryAfter(control.ErrBusy, time.Second))
		s := newTestSession(t, g, nil, 3*time.Second)
		t0 := time.Now()
		err := s.Join(context.Background())
		if !errors.Is(err, control.ErrBusy) || !strings.Contains(err.Error(), "--join-timeout") {
			t.Errorf("join: %v, want the gateway's busy answer and the timeout named", err)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("gave up after %v, want about 3 s", d)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // nothing listens: connection refused
		gws, err := ParseGateways(addr, "sha256:"+strings.Repeat("ab", 32), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		priv, _ := wgkey.Generate()
		s := NewSession(SessionConfig{Gateways: gws, Key: priv, JoinTimeout: 2500 * time.Millisecond})
		t0 := time.Now()
		err = s.Join(context.Background())
		if !errors.Is(err, control.ErrUnreachable) || time.Since(t0) < 500*time.Millisecond {
			t.Errorf("join of an unreachable gateway: %v after %v, want it to retry, then ErrUnreachable", err, time.Since(t0))
		}
	})
}

// TestSessionNewKeyWhenSquatted checks that a session whose key a
// stranger holds at the gateway (issue 25, hole 9: someone with a token
// who learnt the key joined with it while the job's lease was gone)
// recovers: it makes a new key, puts it in its WireGuard device, and
// joins with it, rather than failing with key_in_use forever.
func TestSessionNewKeyWhenSquatted(t *testing.T) {
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Second})
	var stderr syncbuf.Buffer
	s := testSession(t, g, &stderr)
	old := s.priv.PublicKey()
	b.Squat(old)
	b.SetRenewErr(fmt.Errorf("%w: no such lease", control.ErrUnknownLease))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Supervise(ctx) }()
	if !topology.Poll(5*time.Second, func() bool {
		keys := b.Keys()
		return len(keys) >= 3 && keys[len(keys)-1] != old
	}) {
		t.Fatalf("no join with a new key after the old one was squatted: keys %v, calls %v", b.Keys(), b.Calls())
	}
	b.SetRenewErr(nil)
	cancel()
	<-done
	if s.priv.PublicKey() == old || s.req.PublicKey != s.priv.PublicKey() {
		t.Errorf("session key %v (request %v), want a new one in both", s.priv.PublicKey(), s.req.PublicKey)
	}
	if got := s.wg.PublicKey(); got != s.priv.PublicKey() {
		t.Errorf("WireGuard device's key %v, want the new %v", got, s.priv.PublicKey())
	}
}

// TestResyncWaitsForGateway: after a loss, a session whose restarted
// gateway says it will start the handshake (resume) waits that long for
// it before it starts one itself; without the promise it starts one at
// once.
func TestResyncWaitsForGateway(t *testing.T) {
	g := controltest.Start(t, nil, controltest.Options{})
	s := testSession(t, g, nil)
	ctx := context.Background()
	for _, c := range []struct {
		resume   time.Duration
		min, max time.Duration
	}{
		{0, 0, 200 * time.Millisecond},
		{400 * time.Millisecond, 400 * time.Millisecond, 2 * time.Second},
	} {
		t0 := time.Now()
		if err := s.resync(ctx, c.resume, t0.Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d < c.min || d > c.max {
			t.Errorf("resync with resume %v took %v, want %v to %v", c.resume, d, c.min, c.max)
		}
	}
}

// TestReleaseOnce checks that Release gives the lease back once: the
// namespace job releases it while its namespace is cleaned up
// (netnsJob.close), and closeSession's Release after that asks nothing.
func TestReleaseOnce(t *testing.T) {
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{})
	s := testSession(t, g, nil)
	s.Release()
	s.Release()
	if n := countOf(b.Calls(), "release"); n != 1 {
		t.Errorf("releases after two Release calls: got %d, want 1 (calls %v)", n, b.Calls())
	}
}
