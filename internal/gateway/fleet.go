// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

// A gateway with --store postgres://… is a member of a fleet (package
// fleet): its store.DB is the fleet node, which keeps a replica of the
// fleet's tokens and bans and a journal of this gateway's lease records in
// the state directory's database, and the gateway answers the fleet's
// revocations, bans and kicks for its own leases.

// StoreConfig is the shared database of a fleet.
type StoreConfig struct {
	// URL is the PostgreSQL connection string; "" means no fleet: the
	// state directory's database alone.
	URL string
	// PasswordFile holds the database password (mode 0600).
	PasswordFile string
	// FailClosed refuses joins once the local copy of the fleet's tokens
	// and bans is older than Stale (default: joins go on with it).
	FailClosed bool
	Stale      time.Duration
	// Insecure allows a TCP connection to the database without a
	// verified TLS certificate (--store-insecure).
	Insecure bool
	// FleetKey is the file of the fleet key (--fleet-key, made by airlock
	// db fleet-key): this gateway signs its member record with it and
	// tells clients only of members it signed. "": clients learn no other
	// member.
	FleetKey string
}

// openRemote opens the shared database (openState, once the state
// directory's database is open: it keeps the member id), so that a wrong
// URL or schema stops the gateway before anything else opens.
func (g *gateway) openRemote() error {
	sc := g.cfg.Store
	if sc.URL == "" {
		return nil
	}
	if pgstore.URLHasPassword(sc.URL) {
		g.log.Warn("the --store URL holds a password: every user of this host can read it in ps; use --store-password-file or PGPASSFILE")
	}
	id, err := g.local.MemberID()
	if err != nil {
		return err
	}
	g.memberID = id
	db, err := pgstore.OpenLazy(pgstore.Config{URL: sc.URL, PasswordFile: sc.PasswordFile, Insecure: sc.Insecure, Gateway: id, Logger: g.log})
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	g.remote = db
	g.onClose(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = db.CheckSchema(ctx)
	switch {
	case errors.Is(err, pgstore.ErrSchemaOld), errors.Is(err, pgstore.ErrSchemaNew):
		return fmt.Errorf("--store: %w", err)
	case errors.Is(err, pgstore.ErrTLSRefused):
		// Not an outage: something answers in the database's place, or
		// its TLS is broken. Starting would trust nothing it says, and
		// a site must see this at once.
		return fmt.Errorf("--store: refusing the database: %w", err)
	case err != nil:
		// The database is not in the data path: start with the tokens
		// and bans of the previous run, journal the records.
		g.log.Warn("fleet database unreachable at start: joins use the copy of the fleet's tokens and bans from this gateway's previous run until it answers",
			"err", err)
	}
	return nil
}

// openFleet makes the fleet node (openServers, before the leases of the
// previous run are restored: their tokens are checked against the fleet's).
func (g *gateway) openFleet() error {
	if g.remote == nil {
		// A single gateway (again): its own tokens.
		return g.local.SetFleet("")
	}
	var key ed25519.PrivateKey
	if g.cfg.Store.FleetKey != "" {
		k, err := fleet.LoadKey(g.cfg.Store.FleetKey)
		if err != nil {
			return fmt.Errorf("--fleet-key: %w", err)
		}
		key = k
	} else {
		g.log.Warn("no --fleet-key: this gateway tells its jobs of no other gateway of the fleet, so they do not fail over; give every gateway the same fleet key (airlock db fleet-key, docs/fleet.md)")
	}
	n, err := fleet.New(fleet.Config{
		Key:    key,
		Logger: g.log.With("component", "fleet"),
		Local:  g.local,
		Remote: g.remote,
		Self: store.Member{ID: g.memberID, Advertise: g.advertise, Version: g.cfg.Version,
			Started: g.started},
		Pin: g.fleetPin,
		Load: func() fleet.Load {
			return fleet.Load{Jobs: g.leases.Len(), Capacity: g.egress.capacity.Jobs, Draining: g.tr.draining.Load()}
		},
		FailClosed: g.cfg.Store.FailClosed,
		Stale:      g.cfg.Store.Stale,
		OnRevoke:   g.onFleetRevoke,
		OnBan:      g.onFleetBan,
		OnKick:     g.onFleetKick,
	})
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	if err := g.local.SetFleet(pgstore.Redact(g.cfg.Store.URL)); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	g.fleet, g.st = n, n
	g.log.Info("member of a fleet: tokens, bans and attribution are shared through the database",
		"member", g.memberID, "fail_closed", g.cfg.Store.FailClosed)
	return nil
}

// fleetFresh refuses a join, with a token or without one, while a
// fail-closed fleet member's copy of the fleet's tokens and bans is stale
// (fleet.Node.Fresh); nil for a single gateway.
func (g *gateway) fleetFresh() error {
	if g.fleet == nil {
		return nil
	}
	if err := g.fleet.Fresh(time.Now()); err != nil {
		return fmt.Errorf("%w: %w", control.ErrStoreUnavailable, err)
	}
	return nil
}

// claimJobCredential claims the job credential of an attested join for
// its lease in the whole fleet (fleet.Node.ClaimJobCredential): a copy of
// it used on another member is refused as a failed attestation. Nil for a
// single gateway, and for a join without a verified job credential.
func (g *gateway) claimJobCredential(req control.JoinRequest, lease string) error {
	if g.fleet == nil || req.Attest == nil || req.Attest.MungeJob == "" || req.Attested == nil {
		return nil
	}
	err := g.fleet.ClaimJobCredential(req.Attest.MungeJob, lease)
	switch {
	case errors.Is(err, fleet.ErrJobCredentialUsed):
		g.log.Warn("join refused: its job credential was used on another gateway of the fleet", "lease", lease, "err", err)
		return fmt.Errorf("%w: %w", control.ErrAttestation, err)
	case err != nil:
		return fmt.Errorf("%w: %w", control.ErrStoreUnavailable, err)
	}
	return nil
}

// loadBans applies the bans in force from the store (a single gateway's
// survive its restarts; a fleet's come from every gateway).
func (g *gateway) loadBans(now time.Time) error {
	bans, err := g.st.Bans(now)
	if err != nil {
		return fmt.Errorf("read bans: %w", err)
	}
	g.admit.mu.Lock()
	defer g.admit.mu.Unlock()
	for _, b := range bans {
		g.admit.banLocked(b, now)
	}
	return nil
}

// onFleetRevoke ends the live leases of a token revoked anywhere in the
// fleet.
func (g *gateway) onFleetRevoke(token string) {
	reason := "token " + token + " revoked"
	for _, l := range g.leases.Leases() {
		if o := l.Owner; o.Token == token {
			if _, ok := g.endLease(l.ID, "airlock token revoke", reason, reason); ok {
				g.log.Warn("token revoked in the fleet: lease ended", "lease", l.ID, "addrs", l.Addrs, "token", token)
			}
		}
	}
}

// onFleetBan applies a ban made anywhere in the fleet and ends the live
// leases it matches.
func (g *gateway) onFleetBan(b store.Ban) {
	now := time.Now()
	if !now.Before(b.Until) {
		return
	}
	g.admit.mu.Lock()
	g.admit.banLocked(b, now)
	g.admit.mu.Unlock()
	g.endBanned(b, "")
}

// endBanned ends the live leases that ban b matches, but the lease
// except (the one a kick ends itself).
func (g *gateway) endBanned(b store.Ban, except string) {
	why := "banned by admin"
	if b.Reason != "" {
		why += ": " + b.Reason
	}
	for _, l := range g.leases.Leases() {
		o := l.Owner
		if l.ID == except {
			continue
		}
		if banCovers(b, o) {
			if _, ok := g.endLease(l.ID, "airlock kick --ban", b.Reason, why); ok {
				g.log.Warn("ban: lease of the banned token and host ended", "lease", l.ID, "addrs", l.Addrs, "token", b.Token, "host", o.Claimed.Hostname)
			}
		}
	}
}

// onFleetKick ends a lease of this gateway on an admin's order given on
// another gateway or an admin host.
func (g *gateway) onFleetKick(k pgstore.Kick) pgstore.KickResult {
	var l lease.Lease
	found := false
	for _, x := range g.leases.Leases() {
		if x.ID == k.Lease {
			l, found = x, true
		}
	}
	if !found {
		return pgstore.KickResult{Error: "lease " + k.Lease + " is not live on " + g.advertise}
	}
	if k.Ban > 0 {
		o := l.Owner
		b, _ := g.admit.ban(o, k.Ban, k.Reason)
		g.endBanned(b, k.Lease)
	}
	why := "kicked by admin"
	if k.Reason != "" {
		why += ": " + k.Reason
	}
	_, ok := g.endLease(k.Lease, "airlock kick", k.Reason, why)
	g.log.Warn("job kicked through the fleet: lease ended", "lease", k.Lease, "by", k.By, "reason", k.Reason, "ban", k.Ban, "ended", ok)
	return pgstore.KickResult{Ended: ok}
}

// fleetPin is the pin this gateway announces to the fleet: its current
// one, or during a key rotation the next and the current one, so that a
// client that learns it now still trusts the gateway after the rotation's
// --finish.
func (g *gateway) fleetPin() string {
	cur, next := g.res.ids.Pins()
	if next == "" {
		return cur
	}
	return next + "|" + cur
}

// members is the fleet's member list for a lease: every live gateway's
// address and pin; nil for a single gateway.
func (g *gateway) members() []control.Member {
	if g.fleet == nil {
		return nil
	}
	var out []control.Member
	for _, m := range g.fleet.Members() {
		if m.Draining {
			continue
		}
		pin := m.Pin
		if pin == "" {
			pin = m.ID // a member record of before member ids: its id was its pin
		}
		out = append(out, control.Member{Gateway: m.Advertise, Pin: pin})
	}
	return out
}

// registerFleetAdmin adds the fleet's admin endpoints: GET /v1/fleet
// (airlock status --fleet) and POST /v1/fleet/kick (airlock kick of a job
// that another gateway holds).
func (g *gateway) registerFleetAdmin(adm *admin.Server) {
	adm.SetFleet(g.fleet)
	adm.Handle("GET "+admin.FleetPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.fleet == nil {
			admin.WriteError(w, http.StatusNotFound, "not_supported", "this gateway is not in a fleet: start it with --store postgres://…")
			return
		}
		st, err := fleet.FleetStatus(g.fleet.Remote())
		if err != nil {
			admin.WriteError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf("fleet status: %v", err))
			return
		}
		admin.WriteJSON(w, http.StatusOK, st)
	}))
}

// logFleetHistory says how much the fleet's shared history keeps (after
// each prune).
func (g *gateway) logFleetHistory(keep time.Duration) {
	if g.remote == nil {
		return
	}
	h, err := g.remote.HistoryStats()
	if err != nil {
		return
	}
	g.log.Info("fleet lease history", "leases", h.Leases, "live", h.Live, "oldest", h.Oldest, "bytes", h.Bytes, "retention", keep)
}

// registerFleetMetrics adds the fleet's series (docs/metrics.md); none for
// a single gateway.
func (g *gateway) registerFleetMetrics(reg prometheus.Registerer) error {
	if g.fleet == nil {
		return nil
	}
	n := g.fleet
	up := func() float64 {
		if n.Health().Reachable {
			return 1
		}
		return 0
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_fleet_database_up",
			Help: "1 while the fleet's database takes this gateway's journaled lease records, 0 while it fails."}, up),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_fleet_journal_records",
			Help: "Lease records journaled locally, waiting to be written to the fleet's database."}, func() float64 { return float64(n.Health().Journaled) }),
		newReplicaAge(n),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "airlock_fleet_members",
			Help: "Live gateways of the fleet, this one included, as last read."}, func() float64 { return float64(len(n.Members())) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register fleet metrics: %w", err)
		}
	}
	return nil
}

// captureRelay is the control server's CaptureRelay: this gateway in a
// fleet; nil for a single gateway, which has no relayed captures.
func (g *gateway) captureRelay() control.CaptureRelay {
	if g.fleet == nil {
		return nil
	}
	return g
}

// OpenCapture implements control.CaptureRelay: a live capture of a job of
// this gateway that an admin asked for elsewhere in the fleet, with the
// checks and limits of a local one (admin.CheckCapture), on the one lease
// the ticket names.
func (g *gateway) OpenCapture(t control.CaptureTicket) (func(ctx context.Context, w io.Writer, flush func()) error, error) {
	c, err := g.fleet.TakeCapture(t)
	if err != nil {
		return nil, err
	}
	req := admin.CaptureRequest{Job: c.Job, Filter: c.Filter, Snaplen: c.Snaplen, Buffer: c.Buffer}
	f, err := admin.CheckCapture(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", control.ErrNoSuchCapture, err)
	}
	if g.leases.Count(func(l lease.Lease) bool { return l.ID == c.Lease }) == 0 {
		return nil, fmt.Errorf("%w: lease %s is not live on gateway %s", control.ErrNoSuchCapture, c.Lease, g.advertise)
	}
	tap, stop, err := g.StartCapture([]string{c.Lease}, req, f)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", control.ErrNoSuchCapture, err)
	}
	g.log.Info("live capture relayed to the fleet started", "ticket", c.ID, "job", c.Job, "lease", c.Lease, "filter", c.Filter, "by", c.By)
	return func(ctx context.Context, w io.Writer, flush func()) error {
		defer stop()
		start := time.Now()
		err := tap.Serve(ctx, w, flush)
		g.log.Info("live capture relayed to the fleet ended", "ticket", c.ID, "lease", c.Lease, "duration", time.Since(start).Round(time.Millisecond), "err", err)
		return err
	}, nil
}

// replicaAge is airlock_fleet_replica_age_seconds: absent until the
// database first confirmed the replica, rather than a -1 that a
// dashboard would average and an alert on "> 120" would never see.
type replicaAge struct {
	n    *fleet.Node
	desc *prometheus.Desc
}

func newReplicaAge(n *fleet.Node) replicaAge {
	return replicaAge{n, prometheus.NewDesc("airlock_fleet_replica_age_seconds",
		"Seconds since the database last confirmed this gateway's copy of the fleet's tokens and bans; absent before the first confirmation.", nil, nil)}
}

func (r replicaAge) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r replicaAge) Collect(ch chan<- prometheus.Metric) {
	if h := r.n.Health(); !h.Synced.IsZero() {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, time.Since(h.Synced).Seconds())
	}
}
