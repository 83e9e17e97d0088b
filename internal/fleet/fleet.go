// SPDX-License-Identifier: MIT

// Package fleet makes a gateway one member of a fleet of gateways that
// share their state through PostgreSQL (internal/store/pgstore): tokens,
// bans and revocations hold on every gateway, every gateway's lease history
// answers whois from any of them, and each gateway registers itself so that
// clients and admins see the whole fleet.
//
// Theory of operation. The database is not in the data path: a [Node] is
// the gateway's [store.DB] and keeps, in the gateway's own state database
// (bbolt), a replica of the fleet's tokens and bans and a journal of its
// own lease records.
//
//   - Joins verify tokens and bans against the replica, so they go on while
//     the database is down (with FailClosed, they are refused once the
//     replica is older than Stale). The replica is reloaded whole when the
//     node starts listening on the database (LISTEN airlock), on every
//     notification of a change to tokens or bans (NOTIFY, sent by the
//     schema's triggers at commit: one round trip after an admin's command
//     on any gateway or admin host), and every ResyncEvery. A reload that
//     finds a token gone ends that token's live leases here (OnRevoke);
//     one that finds a new ban applies it and ends the leases it matches
//     (OnBan). So a change made while this gateway could not listen takes
//     effect at its next reload.
//   - Lease records are written to the local database with a journal entry
//     in the same transaction (store.EnableJournal) before the join is
//     acknowledged; a shipper copies journal entries in order to the
//     database and trims them once committed. An outage or a kill -9 of
//     the gateway delays records but loses none; the database's writes are
//     idempotent, so an entry shipped twice is harmless.
//   - Token and ban changes, whois, the fleet's status and kicks go to the
//     database directly: they are admin operations and say so when the
//     database is unreachable.
//   - Every HeartbeatEvery the node writes its member record (address, pin,
//     load, capacity, drain state, version) and reads the others', which
//     the gateway hands to clients with each lease (Members). A member is
//     known by its member id, which its state directory keeps
//     (store.Store.MemberID), not by its pin: a TLS key rotation changes
//     the pin it announces at the next heartbeat, and nothing else.
//
// A Node is safe for concurrent use once New returns; Run drives its loops.
package fleet

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

// Defaults of Config's intervals.
const (
	DefaultHeartbeatEvery = 2 * time.Second
	DefaultResyncEvery    = 30 * time.Second
	DefaultStale          = 60 * time.Second
	// MemberStale is how long without a heartbeat a member is taken for
	// gone.
	MemberStale = 10 * time.Second
)

// ErrUnavailable means the shared database could not be reached for an
// operation that needs it, or a fail-closed gateway's replica is stale
// (store.ErrUnavailable, which the control API answers with 503).
var ErrUnavailable = store.ErrUnavailable

// Load is a gateway's load as it heartbeats it.
type Load struct {
	Jobs, Capacity int
	Draining       bool
}

// Config configures a Node.
type Config struct {
	Logger *slog.Logger
	// Local is the gateway's state database; New turns its journal on.
	Local *store.Store
	// Remote is the shared database, opened for this gateway
	// (pgstore.Config.Gateway = Self.ID).
	Remote *pgstore.Store
	// Self is this gateway's member record (ID, Advertise, Version,
	// Started); Pin and Load fill in the rest at each heartbeat.
	Self store.Member
	// Pin returns the pins clients must trust now (store.Member.Pin): a
	// TLS key rotation changes them while the gateway runs.
	Pin  func() string
	Load func() Load
	// Key is the fleet key (enrol.go): this member signs its record with
	// it, and Members returns only the members whose signature holds.
	// Nil: Members returns this gateway alone.
	Key ed25519.PrivateKey
	// FailClosed refuses joins once the replica has not been confirmed
	// by the database for Stale (default: joins go on with the cached
	// tokens and bans). A fail-closed node reloads at least every
	// Stale/3.
	FailClosed bool
	Stale      time.Duration
	// HeartbeatEvery and ResyncEvery default to DefaultHeartbeatEvery and
	// DefaultResyncEvery.
	HeartbeatEvery, ResyncEvery time.Duration
	// OnRevoke is called (from the node's goroutine) with the name of a
	// token that was revoked elsewhere (not through this node's own
	// RevokeToken, whose caller does it): end its leases here.
	OnRevoke func(token string)
	// OnBan is called with a ban made elsewhere in the fleet (not
	// through this node's own AddBan): apply it and end the leases it
	// matches.
	OnBan func(store.Ban)
	// OnKick is called with a kick request for a lease of this gateway;
	// it ends the lease and reports whether it did.
	OnKick func(pgstore.Kick) pgstore.KickResult
}

// Node is a gateway's membership in a fleet and its store.DB. It is safe
// for concurrent use.
type Node struct {
	cfg Config
	log *slog.Logger
	// writeMu orders this node's own revocations and bans with the
	// reloads: a reload must not take them for changes made elsewhere
	// (their callers apply them).
	writeMu sync.Mutex
	local   *store.Store
	remote  *pgstore.Store
	ship    chan struct{} // wakes the shipper
	// work counts the reloads and kick queries that notifications and
	// the resync ticker caused (NotifySpacing bounds their rate).
	work atomic.Int64
	// heartbeatDenied is set while the database refuses the member
	// record (logged once).
	heartbeatDenied atomic.Bool

	mu       sync.Mutex
	synced   time.Time       // guarded by mu: the replica's last confirmation
	tokens   map[string]bool // guarded by mu: token names in the replica
	bans     map[int64]bool  // guarded by mu: ban ids applied
	members  []store.Member  // guarded by mu: live enrolled members, by address
	refused  map[string]bool // guarded by mu: member ids refused (logged once)
	backlog  int             // guarded by mu: journal entries waiting
	down     bool            // guarded by mu: the shipper is failing
	downFrom time.Time       // guarded by mu
}

var _ store.DB = (*Node)(nil)

// New makes a node; Run starts its loops. The replica is loaded from the
// database if it answers now; otherwise the local one stays in force (from
// the gateway's previous run).
func New(cfg Config) (*Node, error) {
	if cfg.Logger == nil || cfg.Local == nil || cfg.Remote == nil || cfg.Self.ID == "" {
		return nil, errors.New("fleet: incomplete config")
	}
	if cfg.HeartbeatEvery <= 0 {
		cfg.HeartbeatEvery = DefaultHeartbeatEvery
	}
	if cfg.ResyncEvery <= 0 {
		cfg.ResyncEvery = DefaultResyncEvery
	}
	if cfg.Stale <= 0 {
		cfg.Stale = DefaultStale
	}
	if cfg.FailClosed && cfg.ResyncEvery > cfg.Stale/3 {
		// A replica that nothing changes is confirmed only by a reload:
		// a fail-closed node reloads often enough that an answering
		// database never lets it go stale (two reloads may fail).
		cfg.ResyncEvery = max(cfg.Stale/3, 100*time.Millisecond)
	}
	if cfg.Load == nil {
		cfg.Load = func() Load { return Load{} }
	}
	if cfg.Pin == nil {
		pin := cfg.Self.Pin
		cfg.Pin = func() string { return pin }
	}
	if cfg.OnRevoke == nil {
		cfg.OnRevoke = func(string) {}
	}
	if cfg.OnBan == nil {
		cfg.OnBan = func(store.Ban) {}
	}
	if cfg.OnKick == nil {
		cfg.OnKick = func(pgstore.Kick) pgstore.KickResult { return pgstore.KickResult{Error: "not supported"} }
	}
	cfg.Local.EnableJournal()
	n := &Node{cfg: cfg, log: cfg.Logger, local: cfg.Local, remote: cfg.Remote, ship: make(chan struct{}, 1),
		tokens: map[string]bool{}, bans: map[int64]bool{}, refused: map[string]bool{}}
	// The replica of the previous run: its tokens are the baseline for
	// revocations, its bans are already applied by the gateway.
	toks, err := cfg.Local.Tokens()
	if err != nil {
		return nil, err
	}
	for _, t := range toks {
		n.tokens[t.Name] = true
	}
	if err := n.resync(); err != nil {
		n.log.Warn("fleet database unreachable at start: joins use the tokens and bans of the previous run until it answers", "err", err)
	}
	return n, nil
}

// Run drives the node until ctx ends: the listener (replica reloads,
// revocations, bans, kicks), the journal shipper and the heartbeat. At the
// end it marks the member stopped and ships what it can.
func (n *Node) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){n.listenLoop, n.shipLoop, n.heartbeatLoop} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(ctx)
		}()
	}
	wg.Wait()
	n.shipOnce()
	self := n.self()
	self.Stopped = true
	if err := n.remote.Heartbeat(self); err != nil {
		n.log.Warn("fleet: cannot mark this gateway stopped", "err", err)
	}
}

// resync reloads the replica from the database and reports what changed.
func (n *Node) resync() error {
	n.writeMu.Lock()
	defer n.writeMu.Unlock()
	now := time.Now()
	toks, err := n.remote.Tokens()
	if err != nil {
		return err
	}
	bans, err := n.remote.Bans(now)
	if err != nil {
		return err
	}
	if err := n.local.ReplaceTokens(toks, bans); err != nil {
		return err
	}
	n.mu.Lock()
	var revoked []string
	seen := make(map[string]bool, len(toks))
	for _, t := range toks {
		seen[t.Name] = true
	}
	for name := range n.tokens {
		if !seen[name] {
			revoked = append(revoked, name)
		}
	}
	n.tokens = seen
	var fresh []store.Ban
	for _, b := range bans {
		if !n.bans[b.ID] {
			n.bans[b.ID] = true
			fresh = append(fresh, b)
		}
	}
	n.synced = now
	n.mu.Unlock()
	for _, name := range revoked {
		n.log.Warn("fleet: token revoked; ending its leases here", "token", name)
		n.cfg.OnRevoke(name)
	}
	for _, b := range fresh {
		n.cfg.OnBan(b)
	}
	return nil
}

// NotifySpacing is the least time between two reloads, and between two
// looks at the kick requests, that notifications cause. Any database user
// may NOTIFY on channel airlock, with any payload: a flood of them costs a
// gateway at most one reload (two queries and a local write) and one kick
// query per NotifySpacing, whatever their number.
const NotifySpacing = 100 * time.Millisecond

// listenLoop keeps a LISTEN connection and reloads on its notifications,
// at every (re)connection and every ResyncEvery.
func (n *Node) listenLoop(ctx context.Context) {
	backoff := time.Second
	for ctx.Err() == nil {
		lctx, cancel := context.WithCancel(ctx)
		tick := time.NewTicker(n.cfg.ResyncEvery)
		resync, kicks := make(chan struct{}, 1), make(chan struct{}, 1)
		go n.notifyWorker(lctx, tick.C, resync, kicks)
		wake := func(c chan struct{}) {
			select {
			case c <- struct{}{}:
			default:
			}
		}
		connected := false
		err := n.remote.Listen(lctx, func() {
			connected = true
			backoff = time.Second
			if err := n.remote.CheckSchema(lctx); err != nil {
				n.log.Error("fleet database schema does not match this gateway; upgrade it to the fleet's version", "err", err)
			}
			// What changed, and the kicks asked, while not listening.
			wake(resync)
			wake(kicks)
		}, func(msg pgstore.Notification) {
			switch msg.Table {
			case "airlock_tokens", "airlock_bans":
				wake(resync)
			case "airlock_kicks":
				wake(kicks)
			}
		})
		tick.Stop()
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, pgstore.ErrTLSRefused):
			n.log.Error("fleet: the database did not prove its identity over TLS: not using it", "err", err)
		case connected:
			n.log.Warn("fleet: lost the database's notifications; reconnecting", "err", err)
		default:
			n.log.Debug("fleet: cannot listen on the database", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// notifyWorker does what the notifications (and the resync ticker) ask:
// reloads of the replica and looks at this gateway's kick requests, each
// coalesced and spaced by NotifySpacing, until ctx ends.
func (n *Node) notifyWorker(ctx context.Context, tick <-chan time.Time, resync, kicks <-chan struct{}) {
	var last time.Time
	for {
		reload, kick := false, false
		select {
		case <-ctx.Done():
			return
		case <-tick:
			reload = true
		case <-resync:
			reload = true
		case <-kicks:
			kick = true
		}
		if wait := NotifySpacing - time.Since(last); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		// Whatever arrived meanwhile is served by this round.
		select {
		case <-resync:
			reload = true
		default:
		}
		select {
		case <-kicks:
			kick = true
		default:
		}
		last = time.Now()
		if reload {
			n.work.Add(1)
			if err := n.resync(); err != nil && ctx.Err() == nil {
				n.log.Warn("fleet: reload of tokens and bans failed", "err", err)
			}
		}
		if kick {
			n.work.Add(1)
			n.kicks()
		}
	}
}

// kicks answers the kick requests addressed to this gateway.
func (n *Node) kicks() {
	ks, err := n.remote.PendingKicks(n.cfg.Self.ID)
	if err != nil {
		n.log.Warn("fleet: cannot read the kick requests", "err", err)
		return
	}
	for _, k := range ks {
		res := n.cfg.OnKick(k)
		if err := n.remote.FinishKick(k.ID, res); err != nil {
			n.log.Warn("fleet: cannot answer a kick request", "id", k.ID, "err", err)
		}
	}
}

// Wake makes the shipper look at the journal now.
func (n *Node) Wake() {
	select {
	case n.ship <- struct{}{}:
	default:
	}
}

// shipLoop copies the journal to the database.
func (n *Node) shipLoop(ctx context.Context) {
	wait := 200 * time.Millisecond
	for {
		if n.shipOnce() {
			wait = 200 * time.Millisecond
		} else {
			wait = min(2*wait, 2*time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-n.ship:
		case <-time.After(wait):
		}
	}
}

// shipBatch is the most journal entries written in one transaction.
const shipBatch = 500

// shipOnce ships the journal until it is empty or the database fails; it
// reports whether the journal is empty.
func (n *Node) shipOnce() bool {
	if !n.shipBans() {
		left, _ := n.local.JournalLen()
		n.setShipping(errors.New("bans wait for the database"), left)
		return false
	}
	for {
		es, err := n.local.Journal(shipBatch)
		if err != nil {
			n.log.Error("fleet: cannot read the journal", "err", err)
			return false
		}
		if len(es) == 0 {
			n.setShipping(nil, 0)
			return true
		}
		recs := make([]store.LeaseRecord, len(es))
		for i, e := range es {
			recs[i] = e.Record
		}
		if err := n.remote.PutLeases(recs); err != nil {
			left, _ := n.local.JournalLen()
			n.setShipping(err, left)
			return false
		}
		if err := n.local.JournalDone(es[len(es)-1].Seq); err != nil {
			n.log.Error("fleet: cannot trim the journal", "err", err)
			return false
		}
	}
}

// setShipping records the shipper's state and logs its changes.
func (n *Node) setShipping(err error, backlog int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.backlog = backlog
	switch {
	case err != nil && !n.down && errors.Is(err, store.ErrNotPermitted):
		n.down, n.downFrom = true, time.Now()
		n.log.Error("fleet database refuses this gateway's records to its role: they stay journaled locally; if this gateway's database role changed, give the new role its rows as the schema's owner (update airlock_leases set writer = 'NEW' where writer = 'OLD'; the same for airlock_gateways)",
			"journaled", backlog, "err", err)
	case err != nil && !n.down:
		n.down, n.downFrom = true, time.Now()
		n.log.Warn("fleet database unreachable: attribution records are journaled locally and written when it is back", "journaled", backlog, "err", err)
	case err == nil && n.down:
		n.down = false
		n.log.Info("fleet database reachable again: journaled attribution records written", "after", time.Since(n.downFrom).Round(time.Second))
	}
}

// heartbeatLoop writes this member's record and reads the others'.
func (n *Node) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.HeartbeatEvery)
	defer t.Stop()
	for {
		n.heartbeat()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (n *Node) self() store.Member {
	m := n.cfg.Self
	m.Pin = n.cfg.Pin()
	l := n.cfg.Load()
	m.Jobs, m.Capacity, m.Draining = l.Jobs, l.Capacity, l.Draining
	if n.cfg.Key != nil {
		m = SignMember(n.cfg.Key, m)
	}
	return m
}

func (n *Node) heartbeat() {
	if err := n.remote.Heartbeat(n.self()); err != nil {
		if errors.Is(err, store.ErrNotPermitted) && !n.heartbeatDenied.Swap(true) {
			n.log.Error("fleet: the database refuses this gateway's member record to its role (another role wrote it): jobs are not told of this gateway; give this role the row as the schema's owner (update airlock_gateways set writer = 'ROLE' where id = 'MEMBER')",
				"member", n.cfg.Self.ID, "err", err)
		}
		return // otherwise the shipper and the listener say so
	}
	n.heartbeatDenied.Store(false)
	ms, err := n.remote.Members()
	if err != nil {
		return
	}
	now, err := n.remote.Now()
	if err != nil {
		return
	}
	var live []store.Member
	checked := 0
	for _, m := range ms {
		if !m.Alive(now, MemberStale) {
			continue
		}
		if checked++; checked > maxMembers {
			// Bounded work per heartbeat, whatever the table holds.
			break
		}
		if err := n.enrolled(m); err != nil {
			n.mu.Lock()
			first := !n.refused[m.ID]
			if first && len(n.refused) < maxRefused {
				n.refused[m.ID] = true
			}
			n.mu.Unlock()
			if first {
				n.log.Error("fleet: a member record in the database is not enrolled by the fleet key: clients are not told of it (a record written with a database password alone, or a gateway without this --fleet-key)",
					"member", store.Truncate(m.ID), "advertise", store.Truncate(m.Advertise), "err", err)
			}
			continue
		}
		live = append(live, m)
	}
	n.mu.Lock()
	n.members = live
	n.mu.Unlock()
}

// maxRefused bounds the member ids whose refusal is remembered (and so
// logged once): a flood of planted rows costs a bounded log.
const maxRefused = 256

// maxMembers bounds the live member records whose signature a heartbeat
// checks (the schema also bounds each gateway role to 16 records).
const maxMembers = 1024

// enrolled returns nil if clients may be told of member m: signed by the
// fleet key, or, without one, this gateway itself.
func (n *Node) enrolled(m store.Member) error {
	if n.cfg.Key == nil {
		if m.ID == n.cfg.Self.ID && m.Advertise == n.cfg.Self.Advertise && m.Pin == n.cfg.Pin() {
			return nil
		}
		return fmt.Errorf("%w: this gateway has no --fleet-key", ErrNotEnrolled)
	}
	return VerifyMember(n.cfg.Key.Public().(ed25519.PublicKey), m)
}

// Members returns the fleet's live enrolled members as last read (this
// gateway included), by advertised address: those whose record the fleet
// key signed (enrol.go).
func (n *Node) Members() []store.Member {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]store.Member(nil), n.members...)
}

// Health describes the node's link to the database.
type Health struct {
	// Synced is when the replica was last confirmed by the database.
	Synced time.Time `json:"synced"`
	// Journaled is how many lease records wait to be written.
	Journaled int `json:"journaled"`
	// Reachable is false while the shipper cannot write.
	Reachable bool `json:"reachable"`
}

// Health returns the node's link to the database.
func (n *Node) Health() Health {
	n.mu.Lock()
	defer n.mu.Unlock()
	return Health{Synced: n.synced, Journaled: n.backlog, Reachable: !n.down}
}

// Remote returns the shared database, for admin operations.
func (n *Node) Remote() *pgstore.Store { return n.remote }

// --- store.DB ---

// CreateToken implements store.DB: in the database, then the replica.
func (n *Node) CreateToken(name string, ttl time.Duration, now time.Time) (string, store.Token, error) {
	secret, t, err := n.remote.CreateToken(name, ttl, now)
	if err != nil {
		return "", t, unavailable(err)
	}
	n.resyncAfterWrite()
	return secret, t, nil
}

// ImportToken implements store.DB.
func (n *Node) ImportToken(name, secret string, ttl time.Duration, now time.Time) (store.Token, error) {
	t, err := n.remote.ImportToken(name, secret, ttl, now)
	if err != nil {
		return t, unavailable(err)
	}
	n.resyncAfterWrite()
	return t, nil
}

// Tokens implements store.DB, from the database, or, while it is
// unreachable, from the replica (with a warning).
func (n *Node) Tokens() ([]store.Token, error) {
	toks, err := n.remote.Tokens()
	if err != nil {
		n.log.Warn("fleet database unreachable: tokens listed from this gateway's copy", "err", err)
		return n.local.Tokens()
	}
	return toks, nil
}

// RestrictToken implements store.DB: in the database, whose notification
// brings it to every gateway's replica.
func (n *Node) RestrictToken(name string, r store.TokenRestrictions) (store.Token, error) {
	t, err := n.remote.RestrictToken(name, r)
	if err != nil {
		return store.Token{}, unavailable(err)
	}
	n.resyncAfterWrite()
	return t, nil
}

// Token implements store.DB from the local replica, as VerifyToken: a
// token revoked anywhere in the fleet is gone from it once the
// notification (or the next resync) arrives.
func (n *Node) Token(name string) (store.Token, error) {
	return n.local.Token(name)
}

// RevokeToken implements store.DB. Every gateway (this one through its
// own notification) ends the token's leases.
func (n *Node) RevokeToken(name string) error {
	n.writeMu.Lock()
	if err := n.remote.RevokeToken(name); err != nil {
		n.writeMu.Unlock()
		return unavailable(err)
	}
	// This gateway's caller ends the token's leases here itself (and
	// reports them): the reload must not.
	n.mu.Lock()
	delete(n.tokens, name)
	n.mu.Unlock()
	n.writeMu.Unlock()
	n.resyncAfterWrite()
	return nil
}

// resyncAfterWrite reloads the replica at once after this gateway's own
// change, so that its effect does not wait for the notification.
func (n *Node) resyncAfterWrite() {
	if err := n.resync(); err != nil {
		n.log.Warn("fleet: reload after a change failed; the notification will bring it", "err", err)
	}
}

// VerifyToken implements store.DB, from the replica (refused as Fresh
// says).
func (n *Node) VerifyToken(secret string, now time.Time) (store.Token, error) {
	if err := n.Fresh(now); err != nil {
		return store.Token{}, err
	}
	return n.local.VerifyToken(secret, now)
}

// Fresh returns nil if this gateway may admit a join now: always, unless
// it is fail-closed and the database has not confirmed its copy of the
// fleet's tokens and bans for Stale; then an error wrapping
// ErrUnavailable. Every join asks, with a token or without one (a join
// by MUNGE credential alone is judged by the bans of the same copy).
func (n *Node) Fresh(now time.Time) error {
	if !n.cfg.FailClosed {
		return nil
	}
	n.mu.Lock()
	age := now.Sub(n.synced)
	n.mu.Unlock()
	if age > n.cfg.Stale {
		return fmt.Errorf("%w: this gateway is fail-closed (--store-fail-closed) and its copy of the fleet's tokens and bans is %v old; it takes joins again once the database answers (other gateways of the fleet may take them now)",
			ErrUnavailable, age.Round(time.Second))
	}
	return nil
}

// addRemoteBan writes b to the database and marks it applied here: this
// gateway's caller applied it, so the reload must not again.
func (n *Node) addRemoteBan(b store.Ban) (store.Ban, error) {
	n.writeMu.Lock()
	defer n.writeMu.Unlock()
	rb, err := n.remote.AddBan(b)
	if err == nil {
		n.mu.Lock()
		n.bans[rb.ID] = true
		n.mu.Unlock()
	}
	return rb, err
}

// AddBan implements store.DB: in the database, whose notification brings
// it to every gateway; while the database is unreachable, kept in this
// gateway's state directory (it holds here at once) and written to the
// database by the shipper when it answers.
func (n *Node) AddBan(b store.Ban) (store.Ban, error) {
	rb, err := n.addRemoteBan(b)
	if err != nil {
		if errors.Is(err, store.ErrNotPermitted) {
			return b, err
		}
		// Kept in the state directory (it survives reloads and restarts)
		// and shipped by the shipper once the database answers.
		if lerr := n.local.AddPendingBan(b); lerr != nil {
			return b, lerr
		}
		n.log.Warn("fleet database unreachable: the ban holds on this gateway now and is written to the database, for the whole fleet, when it answers",
			"token", b.Token, "host", b.Host, "until", b.Until, "err", err)
		n.Wake()
		return b, nil
	}
	n.resyncAfterWrite()
	return rb, nil
}

// ErrJobCredentialUsed means a job credential already admitted a job on
// another gateway of the fleet.
var ErrJobCredentialUsed = errors.New("this job credential already admitted a job on another gateway of the fleet")

// ClaimJobCredential claims job credential cred (root's, from the SPANK
// plugin) for lease on this gateway, so that it admits one job in the
// whole fleet: the error wraps ErrJobCredentialUsed when another member
// claimed it. While the database is unreachable the claim is not made (each
// member's munged still refuses a replay of its own), unless the node is
// fail-closed: then ErrUnavailable.
func (n *Node) ClaimJobCredential(cred, lease string) error {
	h := sha256.Sum256([]byte(cred))
	holder, holderLease, err := n.remote.ClaimJobCredential(h[:], n.cfg.Self.ID, lease)
	if err != nil {
		if n.cfg.FailClosed {
			return fmt.Errorf("%w: cannot check that the job credential was not used on another gateway: %w", ErrUnavailable, err)
		}
		n.log.Warn("fleet database unreachable: a job credential is admitted without checking the fleet's other gateways", "lease", lease, "err", err)
		return nil
	}
	if holder != n.cfg.Self.ID {
		return fmt.Errorf("%w (member %s, lease %s): a job credential admits one job; another copy of it was used (airlock status --fleet names the lease)",
			ErrJobCredentialUsed, store.Truncate(holder), store.Truncate(holderLease))
	}
	return nil
}

// Bans implements store.DB, from the replica, with the bans of this
// gateway that wait to be shipped.
func (n *Node) Bans(now time.Time) ([]store.Ban, error) {
	bans, err := n.local.Bans(now)
	if err != nil {
		return nil, err
	}
	pend, err := n.local.PendingBans(now)
	if err != nil {
		return nil, err
	}
	for _, p := range pend {
		bans = append(bans, p.Ban)
	}
	return bans, nil
}

// shipBans writes the bans made while the database was unreachable, oldest
// first; it reports whether none is left.
func (n *Node) shipBans() bool {
	pend, err := n.local.PendingBans(time.Now())
	if err != nil {
		n.log.Error("fleet: cannot read the bans waiting for the database", "err", err)
		return false
	}
	for _, p := range pend {
		rb, err := n.addRemoteBan(p.Ban)
		if err != nil {
			return false
		}
		if err := n.local.PendingBanDone(p.Seq); err != nil {
			n.log.Error("fleet: cannot forget a shipped ban (it may be written twice, which is harmless)", "err", err)
			return false
		}
		n.log.Info("fleet: a ban made while the database was unreachable is written to it: it holds on every gateway", "id", rb.ID, "token", rb.Token, "until", rb.Until)
	}
	if len(pend) > 0 {
		n.resyncAfterWrite()
	}
	return true
}

// RecordLeaseStart implements store.DB: locally with a journal entry; the
// shipper writes it to the database.
func (n *Node) RecordLeaseStart(r store.LeaseRecord) error {
	if err := n.local.RecordLeaseStart(r); err != nil {
		return err
	}
	n.Wake()
	return nil
}

// RecordLeaseEnd implements store.DB like RecordLeaseStart.
func (n *Node) RecordLeaseEnd(id string, end time.Time, reason string) error {
	if err := n.local.RecordLeaseEnd(id, end, reason); err != nil {
		return err
	}
	n.Wake()
	return nil
}

// ActiveLeases implements store.DB: this gateway's, from its own database.
func (n *Node) ActiveLeases() ([]store.LeaseRecord, error) { return n.local.ActiveLeases() }

// Whois implements store.DB: the whole fleet's history, from the database.
func (n *Node) Whois(addr netip.Addr, port uint16, at time.Time) ([]store.LeaseRecord, error) {
	recs, err := n.remote.Whois(addr, port, at)
	return recs, unavailable(err)
}

// PruneLeases implements store.DB: the local history and the database's.
func (n *Node) PruneLeases(cutoff time.Time) (int, error) {
	if _, err := n.local.PruneLeases(cutoff); err != nil {
		return 0, err
	}
	k, err := n.remote.PruneLeases(cutoff)
	return k, unavailable(err)
}

// Close implements store.DB: it closes the database connection (the
// gateway closes its own database).
func (n *Node) Close() error { return n.remote.Close() }

// unavailable wraps err with ErrUnavailable when it is not one of the
// store's own answers.
func unavailable(err error) error {
	if err == nil {
		return nil
	}
	for _, s := range []error{store.ErrNotFound, store.ErrExists, store.ErrInvalidName, store.ErrBadToken, store.ErrNotPermitted} {
		if errors.Is(err, s) {
			return err
		}
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
