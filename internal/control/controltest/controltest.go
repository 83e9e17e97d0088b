// SPDX-License-Identifier: MIT

// Package controltest provides test doubles for the control protocol: a
// fake [control.Backend] and an in-process gateway control server on
// 127.0.0.1 with a real token store, for tests of clients.
package controltest

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/jointoken"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"golang.org/x/time/rate"
)

// Backend is a fake [control.Backend] that hands out addresses from
// 100.64.0.0/16 and records calls. It is safe for concurrent use; its zero
// value works. Set the exported fields before the server starts.
type Backend struct {
	// JoinErr, if set, is returned by every Join.
	JoinErr error
	// TTL is the lease lifetime; zero means one minute.
	TTL time.Duration
	// Attach, if set, receives the connections of tunnel upgrades
	// (control.Backend.Tunnel); nil closes them.
	Attach func(net.Conn)
	// Instance is reported in Health.
	Instance string
	// RenewErr, if set, is returned by every Renew.
	RenewErr error
	// Resume is what HandshakeDue answers.
	Resume time.Duration

	// gate, write-locked by Block, stalls CheckLease.
	gate sync.RWMutex
	// Attest is reported in Health (what the gateway checks: "munge").
	Attest string

	mu     sync.Mutex
	squat  map[wgkey.Key]bool // keys whose joins get ErrKeyInUse
	keys   []wgkey.Key        // the public keys of joins, in order
	joined []control.JoinRequest
	// reidentified are the identities renewals carried.
	reidentified []identity.Issued
	joins        int
	next         int
	leases       map[string]string // id → secret
	ended        map[string]string // id → why the lease was ended (End)
	calls        []string
	healths      int // load reports asked for (Healths)
}

// End ends lease id on purpose, as an admin's kick does: from then on
// requests about it fail with control.ErrLeaseEnded and why. Call
// control.Server.WakeWatches to tell its watches at once.
func (b *Backend) End(id, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.leases, id)
	if b.ended == nil {
		b.ended = map[string]string{}
	}
	b.ended[id] = why
}

// Join implements control.Backend.
func (b *Backend) Join(ctx context.Context, req control.JoinRequest, tok jointoken.Token, remote netip.AddrPort) (control.Lease, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.joins++
	b.calls = append(b.calls, "join")
	b.keys = append(b.keys, req.PublicKey)
	b.joined = append(b.joined, req)
	if b.JoinErr != nil {
		return control.Lease{}, b.JoinErr
	}
	if b.squat[req.PublicKey] {
		return control.Lease{}, fmt.Errorf("%w: a stranger holds this key", control.ErrKeyInUse)
	}
	if b.leases == nil {
		b.leases = make(map[string]string)
	}
	b.next++
	id := fmt.Sprintf("lease-%d", b.next)
	secret := hex.EncodeToString([]byte(id + "-secret"))
	b.leases[id] = secret
	gw := netip.MustParseAddr("100.64.0.1")
	addr := netip.AddrFrom4([4]byte{100, 64, byte((b.next + 1) >> 8), byte(b.next + 1)})
	return control.Lease{
		ID:               id,
		Secret:           secret,
		Addresses:        []netip.Prefix{netip.PrefixFrom(addr, 16)},
		Gateways:         []netip.Addr{gw},
		DNS:              []netip.Addr{gw},
		MTU:              1420,
		GatewayPublicKey: wgkey.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32},
		Endpoint:         "127.0.0.1:51820",
		RenewInterval:    control.Duration(b.ttl() / 3),
		Expires:          time.Now().Add(b.ttl()).UTC().Truncate(time.Second),
	}, nil
}

func (b *Backend) ttl() time.Duration {
	if b.TTL > 0 {
		return b.TTL
	}
	return time.Minute
}

func (b *Backend) lookupLocked(ref control.LeaseRef) error {
	if why, ok := b.ended[ref.ID]; ok {
		return fmt.Errorf("%w: %s", control.ErrLeaseEnded, why)
	}
	if s, ok := b.leases[ref.ID]; !ok || s != ref.Secret {
		return fmt.Errorf("lease %q: %w", ref.ID, control.ErrUnknownLease)
	}
	return nil
}

// Renew implements control.Backend.
func (b *Backend) Renew(ctx context.Context, ref control.LeaseRef) (control.RenewResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "renew")
	if b.RenewErr != nil {
		return control.RenewResponse{}, b.RenewErr
	}
	if err := b.lookupLocked(ref); err != nil {
		return control.RenewResponse{}, err
	}
	return control.RenewResponse{Expires: time.Now().Add(b.ttl()).UTC().Truncate(time.Second)}, nil
}

// Release implements control.Backend.
func (b *Backend) Release(ctx context.Context, ref control.LeaseRef) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "release")
	if err := b.lookupLocked(ref); err != nil {
		return err
	}
	delete(b.leases, ref.ID)
	return nil
}

// Health implements control.Backend.
func (b *Backend) Health() control.Health {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.healths++
	return control.Health{Jobs: len(b.leases), Instance: b.Instance, Attest: b.Attest}
}

// Tunnel implements control.Backend.
func (b *Backend) Tunnel(ctx context.Context, ref control.LeaseRef, remote netip.AddrPort) (func(net.Conn), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.lookupLocked(ref); err != nil {
		return nil, err
	}
	attach := b.Attach
	if attach == nil {
		attach = func(c net.Conn) { c.Close() }
	}
	return attach, nil
}

// CheckLease implements control.Backend.
func (b *Backend) CheckLease(ref control.LeaseRef) error {
	b.gate.RLock()
	b.gate.RUnlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lookupLocked(ref)
}

// LeaseBypass implements control.Backend: this backend offers no
// site-local bypass (control.ErrNotSupported).
func (b *Backend) LeaseBypass(ref control.LeaseRef) (*control.Bypass, <-chan struct{}, error) {
	return nil, nil, control.ErrNotSupported
}

// HandshakeDue implements control.Backend: Resume, for every lease.
func (b *Backend) HandshakeDue(ref control.LeaseRef) time.Duration { return b.Resume }

// ReportBypass implements control.Backend: it ignores the counters.
func (b *Backend) ReportBypass(ref control.LeaseRef, counts []control.BypassCount) {}

// Block makes CheckLease wait until Unblock: the server's lease watches
// and sessions stall, as on a gateway that stopped answering.
func (b *Backend) Block() { b.gate.Lock() }

// Unblock ends Block.
func (b *Backend) Unblock() { b.gate.Unlock() }

// SetJoinErr sets JoinErr while the server runs.
func (b *Backend) SetJoinErr(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.JoinErr = err
}

// Squat makes joins with key fail with control.ErrKeyInUse, as if a
// stranger who learnt the key held a lease with it.
func (b *Backend) Squat(key wgkey.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.squat == nil {
		b.squat = map[wgkey.Key]bool{}
	}
	b.squat[key] = true
}

// Joins returns the join requests the backend got, in order, as the
// server passed them (with Attested set by the server).
func (b *Backend) Joins() []control.JoinRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]control.JoinRequest(nil), b.joined...)
}

// Keys returns the public keys of the joins so far, in order.
func (b *Backend) Keys() []wgkey.Key {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]wgkey.Key(nil), b.keys...)
}

// SetRenewErr sets RenewErr while the server runs.
func (b *Backend) SetRenewErr(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.RenewErr = err
}

// Calls returns the Backend methods called so far, in order ("join",
// "renew", "release").
func (b *Backend) Calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.calls...)
}

// Healths returns how many load reports (Health) were asked for so far.
func (b *Backend) Healths() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.healths
}

// Gateway is an in-process control server.
type Gateway struct {
	// Addr is the server's HOST:PORT.
	Addr string
	// Pin is the server certificate's fingerprint.
	Pin string
	// Store is the server's token store, in a temporary directory.
	Store   *store.Store
	Backend *Backend
	Server  *control.Server
	// Conns counts the TCP connections the server accepted.
	Conns atomic.Int64
}

// Options tune [Start]. The zero value gives the server's defaults.
type Options struct {
	FailureLimit rate.Limit
	FailureBurst int
	Logger       *slog.Logger
	// WatchHeartbeat is the server's lease watch heartbeat.
	WatchHeartbeat time.Duration
	// OnJoin is passed to the server (control.ServerConfig.OnJoin).
	OnJoin func(code string, took time.Duration)
	// Serve, if set, is the backend the server uses: one that wraps the
	// Backend to add or change behaviour (e.g. site-local bypass).
	Serve control.Backend
	// Attest is passed to the server (control.ServerConfig).
	Attest control.Attester
	// Bearer is passed to the server (control.ServerConfig).
	Bearer control.BearerVerifier
}

// Start runs a control server for b (a new Backend if nil) on 127.0.0.1:0
// with a fresh identity and store in t.TempDir(), and stops it when the
// test ends.
func Start(t testing.TB, b *Backend, opts Options) *Gateway {
	t.Helper()
	if b == nil {
		b = &Backend{}
	}
	dir := t.TempDir()
	cert, pin, _, err := control.LoadOrCreateIdentity(dir, []string{"127.0.0.1"})
	if err != nil {
		t.Fatalf("controltest: identity: %v", err)
	}
	st, err := store.Open(filepath.Join(dir, store.FileName), time.Second)
	if err != nil {
		t.Fatalf("controltest: store: %v", err)
	}
	var serve control.Backend = b
	if opts.Serve != nil {
		serve = opts.Serve
	}
	srv := control.NewServer(control.ServerConfig{
		Logger:         opts.Logger,
		Store:          st,
		Backend:        serve,
		Certificate:    cert,
		FailureLimit:   opts.FailureLimit,
		FailureBurst:   opts.FailureBurst,
		WatchHeartbeat: opts.WatchHeartbeat,
		OnJoin:         opts.OnJoin,
		Attest:         opts.Attest,
		Bearer:         opts.Bearer,
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		st.Close()
		t.Fatalf("controltest: listen: %v", err)
	}
	g := &Gateway{Addr: l.Addr().String(), Pin: pin, Store: st, Backend: b, Server: srv}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(countingListener{l, &g.Conns}) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("controltest: shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("controltest: serve: %v", err)
		}
		st.Close()
	})
	return g
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// Token creates a join token valid for an hour and returns its clear text.
func (g *Gateway) Token(t testing.TB) string {
	t.Helper()
	secret, _, err := g.Store.CreateToken("", time.Hour, time.Now())
	if err != nil {
		t.Fatalf("controltest: create token: %v", err)
	}
	return secret
}

// Reidentify implements control.Backend: it records id (Reidentified).
func (b *Backend) Reidentify(ref control.LeaseRef, id *identity.Issued) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id != nil {
		b.reidentified = append(b.reidentified, *id)
	}
	return nil
}

// Reidentified returns the identities renewals carried, in order.
func (b *Backend) Reidentified() []identity.Issued {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]identity.Issued(nil), b.reidentified...)
}
