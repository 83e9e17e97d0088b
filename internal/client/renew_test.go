// SPDX-License-Identifier: MIT

package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// testSession joins the in-process gateway g and starts WireGuard on a
// channel TUN (no packets flow: the gateway is only a control server).
func testSession(t *testing.T, g *controltest.Gateway, stderr *lockedBuf) *session {
	t.Helper()
	gws, err := parseGateways(g.Addr, g.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	s := &session{
		log: slog.New(slog.DiscardHandler), stderr: stderr, gws: gws, priv: priv,
		req:       control.JoinRequest{Token: g.Token(t), PublicKey: priv.PublicKey()},
		transport: TransportUDP, wait: time.Second, failover: time.Second, warnAfter: 10 * time.Millisecond,
	}
	ctx := context.Background()
	if err := s.join(ctx, nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	s.lease.RenewInterval = control.Duration(50 * time.Millisecond)
	if err := s.startTunnel(ctx, tuntest.NewChannelTUN().TUN()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.wg.Close(); s.closeClients() })
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
			var stderr lockedBuf
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
			go func() { defer close(done); s.supervise(ctx) }()
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
	var stderr lockedBuf
	s := testSession(t, g, &stderr)
	first := s.lease.ID
	b.SetRenewErr(fmt.Errorf("%w: no such lease", control.ErrUnknownLease))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.supervise(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		calls := b.Calls()
		if n := countOf(calls, "join"); n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second join after the lease was forgotten: calls %v", calls)
		}
		time.Sleep(20 * time.Millisecond)
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
	gws, err := parseGateways(g.Addr, g.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	priv, _ := wgkey.Generate()
	ctx := context.Background()
	// The neighbour: bad-token joins from the same address until limited.
	limited := false
	for i := 0; i < 5 && !limited; i++ {
		_, err := gws[0].cc.Join(ctx, control.JoinRequest{Token: "alk1_nope", PublicKey: priv.PublicKey()})
		limited = errors.Is(err, control.ErrRateLimited)
	}
	if !limited {
		t.Fatal("the bad joins were never rate-limited: the test cannot show the wait")
	}
	s := &session{
		log: slog.New(slog.DiscardHandler), gws: gws, priv: priv,
		req: control.JoinRequest{Token: g.Token(t), PublicKey: priv.PublicKey()},
	}
	start := time.Now()
	if err := s.join(ctx, nil, 5*time.Second); err != nil {
		t.Fatalf("join from a rate-limited address: %v, want it to wait and succeed", err)
	}
	t.Logf("joined after %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(s.closeClients)
}

// TestSessionNewKeyWhenSquatted checks that a session whose key a
// stranger holds at the gateway (issue 25, hole 9: someone with a token
// who learnt the key joined with it while the job's lease was gone)
// recovers: it makes a new key, puts it in its WireGuard device, and
// joins with it, rather than failing with key_in_use forever.
func TestSessionNewKeyWhenSquatted(t *testing.T) {
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Second})
	var stderr lockedBuf
	s := testSession(t, g, &stderr)
	old := s.priv.PublicKey()
	b.Squat(old)
	b.SetRenewErr(fmt.Errorf("%w: no such lease", control.ErrUnknownLease))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.supervise(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		keys := b.Keys()
		if len(keys) >= 3 && keys[len(keys)-1] != old {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no join with a new key after the old one was squatted: keys %v, calls %v", keys, b.Calls())
		}
		time.Sleep(20 * time.Millisecond)
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
