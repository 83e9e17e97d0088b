// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"golang.org/x/time/rate"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// Join admission, before a lease is allocated: the token's join rate
// (config [quota] joins_per_minute), which shapes a storm (shapeJoin); then
// an admin's ban of the job's token and host (airlock kick --ban), the
// token's live leases (max_leases), and the ownership of the
// public key: a key that holds a live lease may only join again with
// proof of that lease (control.JoinRequest.Replace), so that knowing a
// job's public key does not let anyone evict it. The checks and the
// allocation run under admission.mu, so that concurrent joins cannot
// overshoot a quota or race a key's check.

// admission is the gateway's join admission: the checks a join passes
// before its lease is allocated, and the state they keep. It is safe for
// concurrent use; it is ready once g is set (gateway.wire).
type admission struct {
	g *gateway
	// attest verifies joins' MUNGE credentials (attest.go).
	attest attestation
	// bearer verifies joins' bearer tokens (bearer.go).
	bearer bearerIdentity
	// maxBlocks is the most port blocks one job may hold
	// (--max-block-size, blocksize.go).
	maxBlocks int

	mu    sync.Mutex
	joins map[string]*joinRate // guarded by mu: token name → its join rate
	bans  map[banKey]ban       // guarded by mu
	// retired remembers the keys of expired leases (retireLocked), in
	// the order they expired.
	retired      map[wgkey.Key]retiredKey // guarded by mu
	retiredOrder []retiredAt              // guarded by mu
}

// retiredAt is an entry of admission.retiredOrder: a key and when it
// was retired (a key retired again has a later entry too).
type retiredAt struct {
	key wgkey.Key
	at  time.Time
}

// Keys of expired leases are kept for retireFor, at most maxRetired of
// them (the oldest go first): a client whose network failed for longer
// than its lease's lifetime joins again with its key and the old lease's
// proof, and a stranger who learnt the key (it is not secret: it travels
// in every handshake) must not take it first and lock the job out
// (issue 25, hole 9). After that, the client makes a new key when a join
// says its key is in use.
const (
	retireFor  = 24 * time.Hour
	maxRetired = 1 << 16
)

// retiredKey is the lease a key held when it expired.
type retiredKey struct {
	lease      string
	secretHash [32]byte
	expired    time.Time
}

// retireLocked remembers that l's key held l until it expired at now.
func (a *admission) retireLocked(l lease.Lease, now time.Time) {
	if a.retired == nil {
		a.retired = map[wgkey.Key]retiredKey{}
	}
	a.pruneRetiredLocked(now)
	for len(a.retiredOrder) >= maxRetired {
		a.dropOldestRetiredLocked()
	}
	k := wgkey.Key(l.PublicKey)
	a.retiredOrder = append(a.retiredOrder, retiredAt{k, now})
	a.retired[k] = retiredKey{lease: l.ID, secretHash: l.SecretHash(), expired: now}
}

// pruneRetiredLocked forgets keys retired longer than retireFor ago.
func (a *admission) pruneRetiredLocked(now time.Time) {
	for len(a.retiredOrder) > 0 && now.Sub(a.retiredOrder[0].at) >= retireFor {
		a.dropOldestRetiredLocked()
	}
}

// dropOldestRetiredLocked drops the oldest entry of retiredOrder, and its
// key unless the key was retired again since.
func (a *admission) dropOldestRetiredLocked() {
	e := a.retiredOrder[0]
	a.retiredOrder = a.retiredOrder[1:]
	if r, ok := a.retired[e.key]; ok && r.expired.Equal(e.at) {
		delete(a.retired, e.key)
	}
}

// retire remembers the keys of leases that expired at now.
func (a *admission) retire(ls []lease.Lease, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range ls {
		a.retireLocked(l, now)
	}
}

// joinRate is a token's joins-per-minute bucket and the quota it was
// made for (a reload may change it).
type joinRate struct {
	perMin int
	lim    *rate.Limiter
}

// banKey is what a ban matches. For a job whose identity was attested:
// its attested uid, with any token or none (token ""), and, for joins that
// carry no attestation, from its node's network: its token, or a claim of
// its uid (a claim that can only hurt the claimer) (unattested).
// Otherwise a token with a host name (compared without case and trailing
// dot), or a token with a source network (an IPv4 address or an IPv6 /64,
// as the failure limiter groups them: a client may lie about its host
// name, and may pick another address of its /64, but not another
// network).
type banKey struct {
	token string
	host  string       // "" for a network or uid ban
	net   netip.Prefix // invalid for a host or uid ban
	uid   int64        // -1 unless a uid ban
	// unattested: the network ban of an attested job's node, which
	// covers only joins with no attested identity (not the node's other
	// users, whose joins are attested).
	unattested bool
	// subject is "ISSUER\nSUBJECT" for a ban of an issuer-verified
	// subject (any token, host or uid), else "".
	subject string
}

// subjectKey is the banKey of a ban of id's issuer and subject.
func subjectKey(issuer, subject string) banKey {
	return banKey{subject: issuer + "\n" + subject, uid: noUID}
}

// noUID is banKey.uid of host and network bans.
const noUID = -1

// attestedUID is the uid a ban of o names: its attested uid, or nil.
func attestedUID(a *identity.Attestation) *uint32 {
	if a == nil {
		return nil
	}
	u := a.UID
	return &u
}

// banHost is the form of a host name that bans compare.
func banHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// banCovers reports whether ban b covers a lease held by o, as
// bannedLocked matches joins: a subject ban every lease of that issuer's
// subject, whatever its token or node; a uid ban every lease of that
// attested uid, whatever its token, and the unattested leases of its
// token from its node; any other ban the leases of its token from its
// host or network.
func banCovers(b store.Ban, o identity.Job) bool {
	if b.Subject != "" {
		return o.Issued != nil && o.Issued.Issuer == b.Issuer && o.Issued.Subject == b.Subject
	}
	addr := o.Remote.Addr()
	inNet := b.Addr.IsValid() && addr.IsValid() && banNet(b.Addr).Contains(addr.Unmap())
	if b.UID != nil {
		if u := o.AttestedUID(); u != nil {
			return *u == *b.UID
		}
		return inNet && (o.Token == b.Token || int64(o.Claimed.UID) == int64(*b.UID))
	}
	if o.Token != b.Token {
		return false
	}
	host := o.Claimed.Hostname
	return b.Host != "" && host != "" && banHost(b.Host) == banHost(host) || inNet
}

// banNet is the network a ban of addr covers.
func banNet(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	bits := 32
	if addr.Is6() {
		bits = 64
	}
	p, _ := addr.Prefix(bits)
	return p
}

type ban struct {
	until  time.Time
	reason string
}

// allocate admits a join and allocates its lease (lease.Manager.Allocate),
// or returns an error wrapping control.ErrBanned, control.ErrQuota or
// control.ErrKeyInUse that tells the user what to do.
func (a *admission) allocate(req control.JoinRequest, tok store.Token, remote netip.AddrPort, pub wgkey.Key, now time.Time) (lease.Lease, string, *lease.Lease, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// The token again, under the lock that `airlock token revoke`'s
	// listing of the token's leases passes through (Leases): a revoke that
	// deleted the token after the control server verified it either sees
	// this join's lease or this join sees the token gone.
	if tok.Name != "" && (req.Issued == nil || req.Issued.As == "") {
		if err := a.tokenLive(tok.Name, now); err != nil {
			return lease.Lease{}, "", nil, err
		}
	}
	o := identity.Job{Claimed: identity.Claimed(req.Job), Token: tok.Name, Remote: remote, Attested: req.Attested, Issued: req.Issued}
	if err := a.bannedLocked(o, now); err != nil {
		return lease.Lease{}, "", nil, err
	}
	// The key's live lease, which this join may only replace with proof.
	var mine *lease.Lease
	if old, ok := a.g.leases.ByKey(pub); ok && !now.After(old.Expires) {
		if !ownsLease(old, req.Replace) {
			return lease.Lease{}, "", nil, fmt.Errorf("%w: this WireGuard public key holds live lease %s; a join with it must prove it holds that lease (its id and secret): every airlock run makes a fresh key, so run it again",
				control.ErrKeyInUse, old.ID)
		}
		mine = &old
	} else if r, ok := a.retired[pub]; ok && now.Sub(r.expired) < retireFor {
		if !provesRetired(r, req.Replace) {
			return lease.Lease{}, "", nil, fmt.Errorf("%w: this WireGuard public key held lease %s, which expired %s ago; a join with it must prove it held that lease (its id and secret): every airlock run makes a fresh key, so run it again",
				control.ErrKeyInUse, r.lease, now.Sub(r.expired).Round(time.Second))
		}
		delete(a.retired, pub) // its retiredOrder entry goes when it is the oldest
	}
	m := a.meterOf(tok.Name, req.Attested)
	q := m.q
	if q.MaxLeases > 0 {
		n := a.g.leases.Count(func(l lease.Lease) bool {
			return m.holds(l.Owner) && !now.After(l.Expires)
		})
		if mine != nil && m.holds(mine.Owner) {
			n-- // replaced by this join
		}
		if n >= q.MaxLeases {
			return lease.Lease{}, "", nil, fmt.Errorf("%w: %s already has %d running jobs, its quota of leases at once (max_leases = %d); wait until one of its jobs ends, or ask the gateway's admin to raise %s",
				control.ErrQuota, m, n, q.MaxLeases, m.key("max_leases"))
		}
	}
	n, err := a.jobBlocks(req.Ports, tok.Name, q)
	if err != nil {
		return lease.Lease{}, "", nil, err
	}
	if mine != nil {
		mo := mine.Owner
		o.Attested = inherit(req.Attested, mo.Attested)
	}
	l, secret, replaced, err := a.g.leases.AllocateRun(pub, o, now, n)
	if err != nil {
		l.Blocks = n // for the refusal's message
	}
	return l, secret, replaced, err
}

// provesRetired reports whether ref names the expired lease r with its
// secret.
func provesRetired(r retiredKey, ref *control.LeaseRef) bool {
	if ref == nil || ref.ID != r.lease {
		return false
	}
	h := sha256.Sum256([]byte(ref.Secret))
	return subtle.ConstantTimeCompare(h[:], r.secretHash[:]) == 1
}

// ownsLease reports whether ref names l with its secret.
func ownsLease(l lease.Lease, ref *control.LeaseRef) bool {
	if ref == nil || ref.ID != l.ID {
		return false
	}
	h, want := sha256.Sum256([]byte(ref.Secret)), l.SecretHash()
	return subtle.ConstantTimeCompare(h[:], want[:]) == 1
}

// joinShapeMax is the longest a join waits at the gateway for its token's
// join rate (joins_per_minute): a storm of one token's jobs queues for a
// while instead of failing, and a longer wait is answered 429 with the rest
// of it as Retry-After, which airlock run waits out too.
const joinShapeMax = 5 * time.Second

// meter is what a join's quotas count against: its token, or, for a join
// without one, its attested uid: at a site that needs no token on its
// nodes, each user has quotas of their own ([quota.user]), so that one
// user cannot hold the others' leases or join rate.
type meter struct {
	token string
	uid   *uint32 // a join without a token: its attested uid
	q     config.Quota
}

// meterOf returns the meter of a join with the token named tok (""
// for none) and attestation att.
func (a *admission) meterOf(tok string, att *identity.Attestation) meter {
	qs := a.g.conf.Load().Quotas
	if tok == "" && att != nil {
		return meter{uid: attestedUID(att), q: qs.User}
	}
	return meter{token: tok, q: qs.ForToken(tok)}
}

// String names m for refusals: `token "x"`, or `uid 1000 (attested, no
// token)`.
func (m meter) String() string {
	if m.uid != nil {
		return fmt.Sprintf("uid %d (attested, joining without a token)", *m.uid)
	}
	return fmt.Sprintf("token %q", m.token)
}

// key names the config key of m's quota q.
func (m meter) key(q string) string {
	if m.uid != nil {
		return "quota.user." + q
	}
	return "quota.token." + m.token + "." + q
}

// bucket is the key of m's join-rate bucket.
func (m meter) bucket() string {
	if m.uid != nil {
		return fmt.Sprintf("\x00uid:%d", *m.uid) // no token name holds a NUL
	}
	return m.token
}

// holds reports whether a lease of o counts against m.
func (m meter) holds(o identity.Job) bool {
	if o.Token != m.token {
		return false
	}
	if m.uid == nil {
		return true
	}
	u := o.AttestedUID()
	return u != nil && *u == *m.uid
}

// shapeJoin waits until the join rate of meter m admits one more join,
// for at most joinShapeMax; when the wait would be longer it returns
// control.ErrQuota with a Retry-After, and uses up nothing of the rate.
func (a *admission) shapeJoin(ctx context.Context, m meter) error {
	q := m.q
	if q.JoinsPerMinute <= 0 {
		return nil
	}
	now := time.Now()
	r := a.reserveJoin(m.bucket(), q, now)
	d := r.DelayFrom(now)
	if d == 0 {
		return nil
	}
	if d > joinShapeMax {
		r.CancelAt(now)
		return control.WithRetryAfter(fmt.Errorf("%w: %s made more than %d joins in the last minute, its quota (joins_per_minute = %d); retry in %v, or ask the gateway's admin to raise %s",
			control.ErrQuota, m, q.JoinsPerMinute, q.JoinsPerMinute, d.Round(time.Second), m.key("joins_per_minute")), d-joinShapeMax/2)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.Cancel()
		return ctx.Err()
	}
}

// reserveJoin reserves one join of token tok's bucket.
func (a *admission) reserveJoin(tok string, q config.Quota, now time.Time) *rate.Reservation {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.joins == nil {
		a.joins = map[string]*joinRate{}
	}
	jr := a.joins[tok]
	if jr == nil || jr.perMin != q.JoinsPerMinute {
		jr = &joinRate{perMin: q.JoinsPerMinute, lim: rate.NewLimiter(rate.Limit(float64(q.JoinsPerMinute)/60), q.JoinsPerMinute)}
		a.joins[tok] = jr
	}
	return jr.lim.ReserveN(now, 1)
}

// banLocked puts ban b in force: joins of its token by its attested uid,
// or from its host or address, are refused until it ends.
func (a *admission) banLocked(b store.Ban, now time.Time) {
	if a.bans == nil {
		a.bans = map[banKey]ban{}
	}
	for k, x := range a.bans {
		if now.After(x.until) {
			delete(a.bans, k)
		}
	}
	v := ban{b.Until, b.Reason}
	if b.Subject != "" {
		a.bans[subjectKey(b.Issuer, b.Subject)] = v
		return
	}
	if b.UID != nil {
		// The person: every token and none; and the unattested joins
		// from the banned job's node of its token or claiming its uid.
		a.bans[banKey{uid: int64(*b.UID)}] = v
		if b.Addr.IsValid() {
			a.bans[banKey{token: b.Token, net: banNet(b.Addr), uid: noUID, unattested: true}] = v
			a.bans[banKey{net: banNet(b.Addr), uid: int64(*b.UID), unattested: true}] = v
		}
		return
	}
	if b.Host != "" {
		a.bans[banKey{token: b.Token, host: banHost(b.Host), uid: noUID}] = v
	}
	if b.Addr.IsValid() {
		a.bans[banKey{token: b.Token, net: banNet(b.Addr), uid: noUID}] = v
	}
}

// reasonOf is " (REASON)" of a ban with a reason, else "".
func reasonOf(b ban) string {
	if b.reason == "" {
		return ""
	}
	return " (" + b.reason + ")"
}

// bannedLocked returns the error for a join of o while a ban matches it,
// else nil.
func (a *admission) bannedLocked(o identity.Job, now time.Time) error {
	token, host, addr, uid := o.Token, o.Claimed.Hostname, o.Remote.Addr(), o.AttestedUID()
	var b ban
	var ok bool
	pick := func(k banKey) {
		if x, xok := a.bans[k]; xok && (!ok || x.until.After(b.until)) {
			b, ok = x, true
		}
	}
	if addr.IsValid() {
		pick(banKey{token: token, net: banNet(addr), uid: noUID})
	}
	if host != "" {
		pick(banKey{token: token, host: banHost(host), uid: noUID})
	}
	if uid != nil {
		pick(banKey{uid: int64(*uid)})
	} else if addr.IsValid() {
		pick(banKey{token: token, net: banNet(addr), uid: noUID, unattested: true})
		pick(banKey{net: banNet(addr), uid: int64(o.Claimed.UID), unattested: true})
	}
	if id := o.Issued; id != nil {
		if x, xok := a.bans[subjectKey(id.Issuer, id.Subject)]; xok && now.Before(x.until) {
			return fmt.Errorf("%w: the gateway's admin banned the jobs of subject %q of issuer %s until %s, %v from now (airlock kick --ban)%s; ask the gateway's admin",
				control.ErrBanned, id.Subject, id.Issuer, x.until.UTC().Format(time.RFC3339), x.until.Sub(now).Round(time.Second), reasonOf(x))
		}
	}
	if !ok || !now.Before(b.until) {
		return nil
	}
	why := ""
	if b.reason != "" {
		why = " (" + b.reason + ")"
	}
	left := b.until.Sub(now).Round(time.Second)
	who := fmt.Sprintf("jobs of token %q from this host", token)
	if uid != nil {
		who = fmt.Sprintf("jobs of token %q from this host, or of uid %d", token, *uid)
	}
	return fmt.Errorf("%w: the gateway's admin banned %s until %s, %v from now (airlock kick --ban)%s; ask the gateway's admin",
		control.ErrBanned, who, b.until.UTC().Format(time.RFC3339), left, why)
}

// ban refuses joins from the token and host of o for d, and records the
// ban in the store: it survives a restart, and in a fleet it holds on
// every gateway (which end the live leases it matches; here, endBanned).
// It returns the ban and, for the admin, what it covers.
func (a *admission) ban(o identity.Job, d time.Duration, reason string) (store.Ban, string) {
	now := time.Now()
	until := now.Add(d)
	b := store.Ban{Token: o.Token, Host: o.Claimed.Hostname, Addr: o.Remote.Addr(), Until: until, Reason: reason, Created: now, By: a.g.advertise}
	if id := o.Issued; id != nil {
		// Issuer-verified: the subject, whatever token, node or uid.
		b.Host, b.Addr, b.Issuer, b.Subject = "", netip.Addr{}, id.Issuer, id.Subject
	} else if att := o.Attested; att != nil {
		// Attested: the user, with any token or none, from any node;
		// and unattested joins of the token from the job's node (the
		// same user, who left out the credential), not the node's other
		// users' attested joins.
		b.Host, b.UID = "", attestedUID(att)
	}
	a.mu.Lock()
	a.banLocked(b, now)
	a.mu.Unlock()
	if _, err := a.g.st.AddBan(b); err != nil {
		a.g.log.Error("ban not stored: it holds on this gateway until it restarts", "token", o.Token, "host", o.Claimed.Hostname, "err", err)
	}
	if b.Subject != "" {
		return b, fmt.Sprintf("joins of subject %q of issuer %s (issuer-verified), with any token, from any node", b.Subject, b.Issuer)
	}
	if b.UID != nil {
		s := fmt.Sprintf("every join by uid %d (attested by %s), with any token or none, from any node, on every gateway of the fleet, and its other running jobs", *b.UID, o.Attested.By)
		if b.Addr.IsValid() {
			s += fmt.Sprintf("; and joins without attested identity from network %s of token %q or claiming uid %d", banNet(b.Addr), o.Token, *b.UID)
		}
		return b, s
	}
	var covers []string
	if o.Claimed.Hostname != "" {
		covers = append(covers, fmt.Sprintf("host name %q (any case)", banHost(o.Claimed.Hostname)))
	}
	if o.Remote.Addr().IsValid() {
		covers = append(covers, "network "+banNet(o.Remote.Addr()).String())
	}
	return b, fmt.Sprintf("joins of token %q from %s", o.Token, strings.Join(covers, " or from "))
}

// tokenLive returns nil if the token named name exists and has not
// expired at now, else an error wrapping control.ErrBadToken (or the
// store's error).
func (a *admission) tokenLive(name string, now time.Time) error {
	t, err := a.g.st.Token(name)
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: token %q was revoked", control.ErrBadToken, name)
	}
	if err != nil {
		return fmt.Errorf("check token %q: %w", name, err)
	}
	if t.Expired(now) {
		return fmt.Errorf("%w: token %q expired at %s", control.ErrBadToken, name, t.Expires.UTC().Format(time.RFC3339))
	}
	return nil
}

// liveTokens returns the names of the tokens that exist and have not
// expired at now: a restart restores only their leases.
func (a *admission) liveTokens(now time.Time) (map[string]bool, error) {
	toks, err := a.g.st.Tokens()
	if err != nil {
		return nil, fmt.Errorf("read tokens: %w", err)
	}
	live := make(map[string]bool, len(toks))
	for _, t := range toks {
		if t.Expires.IsZero() || now.Before(t.Expires) {
			live[t.Name] = true
		}
	}
	return live, nil
}
