// SPDX-License-Identifier: MIT

package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/bearer"
	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/lease"
)

// Identity from bearer tokens at the gateway: the control server asks
// g.bearer (a control.BearerVerifier) to verify the token of every join
// and renewal that carries one (internal/bearer); what it returns is the
// job's issuer-verified identity (identity.Issued), kept in the lease
// (owner.Issued), the lease history (store.LeaseRecord.Issued), the flow
// table's job references, status, whois and the metrics. A job that
// joined with a bearer token alone is accounted under its issuer's name
// (or a [[issuer.map]] of its subject or group): policy rules, limits and
// quotas name it as they name a token. The issuers come from the config
// file's [[issuer]], and a reload may change them; the keys of each are
// kept in the state dir's bearer/ directory.

// BearerDir is the directory of the issuers' cached key sets inside the
// state directory.
const BearerDir = "bearer"

// bearerIdentity is the gateway's control.BearerVerifier: the verifier of
// the issuers in force (nil: none). Safe for concurrent use; the zero
// value takes no tokens.
type bearerIdentity struct {
	cur atomic.Pointer[bearerState]

	// mu guards stop, the refresh loop of the verifier in force.
	mu   sync.Mutex
	stop context.CancelFunc
}

// bearerState is one config's issuers and their verifier.
type bearerState struct {
	v        *bearer.Verifier
	issuers  map[string]config.Issuer // by URL
	required bool
	leeway   time.Duration
}

var _ control.BearerVerifier = (*bearerIdentity)(nil)

// Verify implements control.BearerVerifier.
func (b *bearerIdentity) Verify(ctx context.Context, tok string) (*identity.Issued, error) {
	st := b.cur.Load()
	if st == nil {
		return nil, nil
	}
	id, err := st.v.Verify(ctx, tok)
	switch {
	case errors.Is(err, bearer.ErrUnavailable):
		return nil, fmt.Errorf("%w: %w", control.ErrBearerUnavailable, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", control.ErrBearer, err)
	}
	return &identity.Issued{Issuer: id.Issuer, Subject: id.Subject, Groups: id.Groups, Expires: id.Expires,
		As: st.issuers[id.Issuer].As(id.Subject, id.Groups)}, nil
}

// Required implements control.BearerVerifier.
func (b *bearerIdentity) Required() bool {
	st := b.cur.Load()
	return st != nil && st.required
}

// on reports whether the gateway takes bearer tokens now.
func (b *bearerIdentity) on() bool { return b.cur.Load() != nil }

// expired reports whether a lease identified by id has outlived its
// token (beyond the clocks' leeway) at now.
func (b *bearerIdentity) expired(id *identity.Issued, now time.Time) bool {
	leeway := time.Minute
	if st := b.cur.Load(); st != nil {
		leeway = st.leeway
	}
	return id != nil && !id.Expires.IsZero() && now.After(id.Expires.Add(leeway))
}

// close stops the refresh loop.
func (b *bearerIdentity) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stop != nil {
		b.stop()
		b.stop = nil
	}
}

// applyBearer puts the issuers of c in force, with a new verifier whose
// refresh loop replaces the old one's.
func (a *admission) applyBearer(c config.Bearer) error {
	if len(c.Issuers) == 0 {
		if a.bearer.cur.Swap(nil) != nil {
			a.g.log.Warn("bearer tokens: no [[issuer]] any more: joins need a token, and renewals' bearer tokens are refused")
		}
		a.bearer.close()
		return nil
	}
	bc := bearer.Config{
		Audiences: a.audiences(), CacheDir: filepath.Join(a.g.cfg.StateDir, BearerDir),
		Refresh: c.Refresh, MinRefetch: c.MinRefetch, MaxStale: c.MaxStale, Leeway: c.Leeway,
	}
	st := &bearerState{issuers: map[string]config.Issuer{}, required: c.Required, leeway: cmp.Or(c.Leeway, time.Minute)}
	for _, is := range c.Issuers {
		bc.Issuers = append(bc.Issuers, is.Issuer)
		st.issuers[is.URL] = is
	}
	if err := ensureStateDir(bc.CacheDir, a.g.log); err != nil {
		return fmt.Errorf("bearer tokens: %w", err)
	}
	v, err := bearer.New(bc, a.g.log.With("component", "bearer"))
	if err != nil {
		return fmt.Errorf("bearer tokens: %w", err)
	}
	st.v = v
	ctx, cancel := context.WithCancel(context.Background())
	a.bearer.mu.Lock()
	if a.bearer.stop != nil {
		a.bearer.stop()
	}
	a.bearer.stop = cancel
	a.bearer.mu.Unlock()
	a.bearer.cur.Store(st)
	go v.Run(ctx)
	for _, is := range c.Issuers {
		auds := is.Audiences
		if len(auds) == 0 {
			auds = bc.Audiences
		}
		a.g.log.Info("bearer tokens: trusting issuer", "issuer", is.URL, "name", is.Name, "audience", auds,
			"scopes", is.Scopes, "groups", is.Groups, "required", c.Required)
	}
	return nil
}

// audiences are the "aud" values a token for this gateway may carry when
// its issuer lists none: the advertised address, as HOST:PORT, as an
// https URL, and its host.
func (a *admission) audiences() []string {
	auds := []string{a.g.advertise, "https://" + a.g.advertise}
	if h, _, err := net.SplitHostPort(a.g.advertise); err == nil {
		auds = append(auds, h)
	}
	return auds
}

// Reidentify implements control.Backend: a renewal's verified token
// extends its lease's identity to the token's expiry. The token must
// name the lease's issuer and subject; a lease that joined without one
// takes none at renewal (its identity is its join's).
func (g *gateway) Reidentify(ref control.LeaseRef, id *identity.Issued) error {
	if id == nil {
		return nil
	}
	_, err := g.leases.Reown(ref.ID, ref.Secret, time.Now(), func(o identity.Job) (identity.Job, error) {
		switch {
		case o.Issued == nil:
			return o, nil
		case !o.Issued.Same(id):
			return o, fmt.Errorf("%w: the renewal's token is of %s, the lease's of %s: a job keeps its identity", control.ErrBearer, id.ID(), o.Issued.ID())
		}
		n := *o.Issued
		if id.Expires.After(n.Expires) {
			n.Expires = id.Expires
		}
		o.Issued = &n
		return o, nil
	})
	if errors.Is(err, lease.ErrUnknownLease) {
		return g.admin.leaseGone(ref.ID, err)
	}
	return err
}
