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

// fleetMember is the gateway's fleet part: its membership in a fleet, the
// fleet's tokens, bans and kicks it answers for its own leases, and the
// captures relayed to it. Its fields are set while the gateway opens and
// read-only after; all zero for a single gateway.
type fleetMember struct {
	g *gateway
	// node is the fleet node, the gateway's store.DB; remote the fleet's
	// database; memberID this gateway's id there (store.MemberID).
	node     *fleet.Node
	remote   *pgstore.Store
	memberID string
}

// openRemote opens the shared database (openState, once the state
// directory's database is open: it keeps the member id), so that a wrong
// URL or schema stops the gateway before anything else opens.
func (m *fleetMember) openRemote() error {
	sc := m.g.cfg.Store
	if sc.URL == "" {
		return nil
	}
	if pgstore.URLHasPassword(sc.URL) {
		m.g.log.Warn("the --store URL holds a password: every user of this host can read it in ps; use --store-password-file or PGPASSFILE")
	}
	id, err := m.g.local.MemberID()
	if err != nil {
		return err
	}
	m.memberID = id
	db, err := pgstore.OpenLazy(pgstore.Config{URL: sc.URL, PasswordFile: sc.PasswordFile, Insecure: sc.Insecure, Gateway: id, Logger: m.g.log})
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	m.remote = db
	m.g.onClose(func() { db.Close() })
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
		m.g.log.Warn("fleet database unreachable at start: joins use the copy of the fleet's tokens and bans from this gateway's previous run until it answers",
			"err", err)
	}
	return nil
}

// openFleet makes the fleet node (openServers, before the leases of the
// previous run are restored: their tokens are checked against the fleet's).
func (m *fleetMember) openFleet() error {
	if m.remote == nil {
		// A single gateway (again): its own tokens.
		return m.g.local.SetFleet("")
	}
	var key ed25519.PrivateKey
	if m.g.cfg.Store.FleetKey != "" {
		k, err := fleet.LoadKey(m.g.cfg.Store.FleetKey)
		if err != nil {
			return fmt.Errorf("--fleet-key: %w", err)
		}
		key = k
	} else {
		m.g.log.Warn("no --fleet-key: this gateway tells its jobs of no other gateway of the fleet, so they do not fail over; give every gateway the same fleet key (airlock db fleet-key, docs/fleet.md)")
	}
	n, err := fleet.New(fleet.Config{
		Key:    key,
		Logger: m.g.log.With("component", "fleet"),
		Local:  m.g.local,
		Remote: m.remote,
		Self: store.Member{ID: m.memberID, Advertise: m.g.advertise, Version: m.g.cfg.Version,
			Started: m.g.started},
		Pin: m.fleetPin,
		Load: func() fleet.Load {
			return fleet.Load{Jobs: m.g.leases.Len(), Capacity: m.g.egress.capacity.Jobs, Draining: m.g.tr.draining.Load()}
		},
		FailClosed: m.g.cfg.Store.FailClosed,
		Stale:      m.g.cfg.Store.Stale,
		OnRevoke:   m.onFleetRevoke,
		OnBan:      m.onFleetBan,
		OnKick:     m.onFleetKick,
	})
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	if err := m.g.local.SetFleet(pgstore.Redact(m.g.cfg.Store.URL)); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	m.node, m.g.st = n, n
	m.g.log.Info("member of a fleet: tokens, bans and attribution are shared through the database",
		"member", m.memberID, "fail_closed", m.g.cfg.Store.FailClosed)
	return nil
}

// fleetFresh refuses a join, with a token or without one, while a
// fail-closed fleet member's copy of the fleet's tokens and bans is stale
// (fleet.Node.Fresh); nil for a single gateway.
func (m *fleetMember) fleetFresh() error {
	if m.node == nil {
		return nil
	}
	if err := m.node.Fresh(time.Now()); err != nil {
		return fmt.Errorf("%w: %w", control.ErrStoreUnavailable, err)
	}
	return nil
}

// claimJobCredential claims the job credential of an attested join for
// its lease in the whole fleet (fleet.Node.ClaimJobCredential): a copy of
// it used on another member is refused as a failed attestation. Nil for a
// single gateway, and for a join without a verified job credential.
func (m *fleetMember) claimJobCredential(req control.JoinRequest, lease string) error {
	if m.node == nil || req.Attest == nil || req.Attest.MungeJob == "" || req.Attested == nil {
		return nil
	}
	err := m.node.ClaimJobCredential(req.Attest.MungeJob, lease)
	switch {
	case errors.Is(err, fleet.ErrJobCredentialUsed):
		m.g.log.Warn("join refused: its job credential was used on another gateway of the fleet", "lease", lease, "err", err)
		return fmt.Errorf("%w: %w", control.ErrAttestation, err)
	case err != nil:
		return fmt.Errorf("%w: %w", control.ErrStoreUnavailable, err)
	}
	return nil
}

// loadBans applies the bans in force from the store (a single gateway's
// survive its restarts; a fleet's come from every gateway).
func (m *fleetMember) loadBans(now time.Time) error {
	bans, err := m.g.st.Bans(now)
	if err != nil {
		return fmt.Errorf("read bans: %w", err)
	}
	m.g.admit.mu.Lock()
	defer m.g.admit.mu.Unlock()
	for _, b := range bans {
		m.g.admit.banLocked(b, now)
	}
	return nil
}

// onFleetRevoke ends the live leases of a token revoked anywhere in the
// fleet.
func (m *fleetMember) onFleetRevoke(token string) {
	reason := "token " + token + " revoked"
	for _, l := range m.g.leases.Leases() {
		if o := l.Owner; o.Token == token {
			if _, ok := m.g.admin.endLease(l.ID, "airlock token revoke", reason, reason); ok {
				m.g.log.Warn("token revoked in the fleet: lease ended", "lease", l.ID, "addrs", l.Addrs, "token", token)
			}
		}
	}
}

// onFleetBan applies a ban made anywhere in the fleet and ends the live
// leases it matches.
func (m *fleetMember) onFleetBan(b store.Ban) {
	now := time.Now()
	if !now.Before(b.Until) {
		return
	}
	m.g.admit.mu.Lock()
	m.g.admit.banLocked(b, now)
	m.g.admit.mu.Unlock()
	m.endBanned(b, "")
}

// endBanned ends the live leases that ban b matches, but the lease
// except (the one a kick ends itself).
func (m *fleetMember) endBanned(b store.Ban, except string) {
	why := "banned by admin"
	if b.Reason != "" {
		why += ": " + b.Reason
	}
	for _, l := range m.g.leases.Leases() {
		o := l.Owner
		if l.ID == except {
			continue
		}
		if banCovers(b, o) {
			if _, ok := m.g.admin.endLease(l.ID, "airlock kick --ban", b.Reason, why); ok {
				m.g.log.Warn("ban: lease of the banned token and host ended", "lease", l.ID, "addrs", l.Addrs, "token", b.Token, "host", o.Claimed.Hostname)
			}
		}
	}
}

// onFleetKick ends a lease of this gateway on an admin's order given on
// another gateway or an admin host.
func (m *fleetMember) onFleetKick(k pgstore.Kick) pgstore.KickResult {
	var l lease.Lease
	found := false
	for _, x := range m.g.leases.Leases() {
		if x.ID == k.Lease {
			l, found = x, true
		}
	}
	if !found {
		return pgstore.KickResult{Error: "lease " + k.Lease + " is not live on " + m.g.advertise}
	}
	if k.Ban > 0 {
		o := l.Owner
		b, _ := m.g.admit.ban(o, k.Ban, k.Reason)
		m.endBanned(b, k.Lease)
	}
	why := "kicked by admin"
	if k.Reason != "" {
		why += ": " + k.Reason
	}
	_, ok := m.g.admin.endLease(k.Lease, "airlock kick", k.Reason, why)
	m.g.log.Warn("job kicked through the fleet: lease ended", "lease", k.Lease, "by", k.By, "reason", k.Reason, "ban", k.Ban, "ended", ok)
	return pgstore.KickResult{Ended: ok}
}

// fleetPin is the pin this gateway announces to the fleet: its current
// one, or during a key rotation the next and the current one, so that a
// client that learns it now still trusts the gateway after the rotation's
// --finish.
func (m *fleetMember) fleetPin() string {
	cur, next := m.g.res.ids.Pins()
	if next == "" {
		return cur
	}
	return next + "|" + cur
}

// members is the fleet's member list for a lease: every live gateway's
// address and pin; nil for a single gateway.
func (m *fleetMember) members() []control.Member {
	if m.node == nil {
		return nil
	}
	var out []control.Member
	for _, mb := range m.node.Members() {
		if mb.Draining {
			continue
		}
		pin := mb.Pin
		if pin == "" {
			pin = mb.ID // a member record of before member ids: its id was its pin
		}
		out = append(out, control.Member{Gateway: mb.Advertise, Pin: pin})
	}
	return out
}

// registerFleetAdmin adds the fleet's admin endpoints: GET /v1/fleet
// (airlock status --fleet) and POST /v1/fleet/kick (airlock kick of a job
// that another gateway holds).
func (m *fleetMember) registerFleetAdmin(adm *admin.Server) {
	adm.SetFleet(m.node)
	adm.Handle("GET "+admin.FleetPath, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.node == nil {
			admin.WriteError(w, http.StatusNotFound, "not_supported", "this gateway is not in a fleet: start it with --store postgres://…")
			return
		}
		st, err := fleet.FleetStatus(m.node.Remote())
		if err != nil {
			admin.WriteError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf("fleet status: %v", err))
			return
		}
		admin.WriteJSON(w, http.StatusOK, st)
	}))
}

// logFleetHistory says how much the fleet's shared history keeps (after
// each prune).
func (m *fleetMember) logFleetHistory(keep time.Duration) {
	if m.remote == nil {
		return
	}
	h, err := m.remote.HistoryStats()
	if err != nil {
		return
	}
	m.g.log.Info("fleet lease history", "leases", h.Leases, "live", h.Live, "oldest", h.Oldest, "bytes", h.Bytes, "retention", keep)
}

// registerFleetMetrics adds the fleet's series (docs/metrics.md); none for
// a single gateway.
func (m *fleetMember) registerFleetMetrics(reg prometheus.Registerer) error {
	if m.node == nil {
		return nil
	}
	n := m.node
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
func (m *fleetMember) captureRelay() control.CaptureRelay {
	if m.node == nil {
		return nil
	}
	return m
}

// OpenCapture implements control.CaptureRelay: a live capture of a job of
// this gateway that an admin asked for elsewhere in the fleet, with the
// checks and limits of a local one (admin.CheckCapture), on the one lease
// the ticket names.
func (m *fleetMember) OpenCapture(t control.CaptureTicket) (func(ctx context.Context, w io.Writer, flush func()) error, error) {
	c, err := m.node.TakeCapture(t)
	if err != nil {
		return nil, err
	}
	req := admin.CaptureRequest{Job: c.Job, Filter: c.Filter, Snaplen: c.Snaplen, Buffer: c.Buffer}
	f, err := admin.CheckCapture(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", control.ErrNoSuchCapture, err)
	}
	if m.g.leases.Count(func(l lease.Lease) bool { return l.ID == c.Lease }) == 0 {
		return nil, fmt.Errorf("%w: lease %s is not live on gateway %s", control.ErrNoSuchCapture, c.Lease, m.g.advertise)
	}
	tap, stop, err := m.g.admin.StartCapture([]string{c.Lease}, req, f)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", control.ErrNoSuchCapture, err)
	}
	m.g.log.Info("live capture relayed to the fleet started", "ticket", c.ID, "job", c.Job, "lease", c.Lease, "filter", c.Filter, "by", c.By)
	return func(ctx context.Context, w io.Writer, flush func()) error {
		defer stop()
		start := time.Now()
		err := tap.Serve(ctx, w, flush)
		m.g.log.Info("live capture relayed to the fleet ended", "ticket", c.ID, "lease", c.Lease, "duration", time.Since(start).Round(time.Millisecond), "err", err)
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
