// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/attest"
	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/metrics"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/version"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// gateway is the control server's Backend: it turns joins into leases and
// WireGuard peers. It is safe for concurrent use.
type gateway struct {
	log    *slog.Logger
	cfg    Config
	leases *lease.Manager
	wg     *tunnel.Gateway
	wgPriv wgkey.Key
	wgPub  wgkey.Key
	// gwAddr is the gateway's address in the IPv4 tunnel subnet, tunnels
	// its tunnel addresses of every family with their subnets' lengths
	// (the IPv4 one first).
	gwAddr    netip.Addr
	tunnels   []netip.Prefix
	advertise string
	// st keeps the tokens, bans and the lease history that attributes
	// outside connections to jobs: local, or in a fleet the shared
	// database behind a local replica and journal (fleet.go).
	st store.DB
	// local is the state directory's own database; st in a single
	// gateway.
	local *store.Store
	// fleet is this gateway's membership in a fleet (fleet.go); its
	// node is st then.
	fleet fleetMember
	// egress is the egress part: the egress mode, public addresses,
	// port-block plan, exposures and capacity (egress.go).
	egress egress
	// backend is the egress backend: jobs' packets, egress, policy,
	// limits and exposures.
	backend forward.Backend
	// flows is the flow table (flows.go), index the job index it shares
	// with the egress backend and the capture taps; started is when Run
	// began.
	flows   *flows.Table
	index   *jobs.Index
	started time.Time
	// metrics are the gateway's metrics; handshakes the joins waiting
	// for their first WireGuard handshake (handshake.go).
	metrics    *metrics.Metrics
	handshakes handshakeWatch
	// conf is the config in force (config file or flags); the admin
	// part's reload replaces it.
	conf atomic.Pointer[config.Config]
	// admin is the gateway as the admin socket sees it: status, kicks,
	// bans, drain, reload, key rotation, backup (admin.go).
	admin adminGateway
	// tr is the TCP transport, lease watches, load report and draining.
	tr *transportState
	// admit is join admission: bans, token quotas, key ownership,
	// attested and bearer identity (quota.go); wakeWatches tells a
	// lease's watches to check it now (control.Server.WakeWatches), nil
	// until the server exists.
	admit       admission
	wakeWatches func(leaseID string)
	// bypassNotice wakes lease watches when a reload may have changed
	// the site-local bypass (bypass.go).
	bypassNotice bypassNotice
	// capture copies jobs' packets to the capture feeds and live
	// captures (capture.go).
	capture *capture.Device
	feeds   feedSet
	// mtu offers clients the larger tunnel MTU their path carries
	// (mtu.go); udp watches the WireGuard sockets' buffers and drops
	// (udpstats.go).
	mtu *pathMTU
	udp *tunnel.SocketWatch
	// res are the listeners and servers open made for serve, and what
	// close undoes (run.go).
	res resources
	// rehs are the restored peers' endpoints and the handshakes the
	// gateway starts with them (rehandshake.go).
	rehs rehandshakes
}

// Join admits a job: lease → egress backend (AddJob) → lease history →
// WireGuard peer. If a step fails, one deferred rollback undoes the steps
// before it: nothing of the job remains.
func (g *gateway) Join(ctx context.Context, req control.JoinRequest, tok store.Token, remote netip.AddrPort) (_ control.Lease, err error) {
	if err := g.fleet.fleetFresh(); err != nil {
		return control.Lease{}, err
	}
	pub := req.PublicKey // validated by the control server
	if g.tr.draining.Load() {
		return control.Lease{}, fmt.Errorf("%w: airlock gateway drain", control.ErrDraining)
	}
	if tok.Name == "" && req.Issued != nil {
		tok = store.Token{Name: req.Issued.As} // accounted under its issuer's name
	}
	if err := g.admit.shapeJoin(ctx, g.admit.meterOf(tok.Name, req.Attested)); err != nil {
		return control.Lease{}, err
	}
	l, secret, err := g.newLease(req, tok, remote, pub)
	if err != nil {
		return control.Lease{}, err
	}
	var added, recorded bool
	defer func() {
		if err == nil {
			return
		}
		_, _ = g.leases.Release(l.ID, secret)
		if added {
			g.removeJob(l)
		}
		if recorded {
			g.recordEnd(l, "wireguard peer failed")
		}
	}()
	if err = g.fleet.claimJobCredential(req, l.ID); err != nil {
		return control.Lease{}, err
	}
	job, err := g.jobOf(l, req.Job.BatchJobID, tok.Name, req.Expose)
	if err != nil {
		g.log.Warn("join refused: bad --expose request", "addrs", l.Addrs, "expose", req.Expose, "err", err)
		return control.Lease{}, fmt.Errorf("%w: %w", control.ErrBadRequest, err)
	}
	if err = g.addJob(job); err != nil {
		g.log.Error("join refused: egress backend cannot add the job", "addrs", l.Addrs, "err", err)
		return control.Lease{}, fmt.Errorf("add job to egress: %w", err)
	}
	added = true
	// Fail closed: a job the history cannot attribute does not get in.
	o := l.Owner
	rec := store.LeaseRecord{
		ID: l.ID, JobID: req.Job.BatchJobID, BatchSystem: req.Job.BatchSystem,
		User: req.Job.User, UID: req.Job.UID, Host: req.Job.Hostname, Command: req.Job.Command,
		Attested: o.Attested, Issued: o.Issued,
		Token: tok.Name, Remote: remote.String(), Gateway: g.advertise, TunnelAddrs: l.AddrList(), Start: l.Start,
		Egress: attributions(job), Resume: resumeState(l, pub, req.Expose),
	}
	for _, x := range job.Exposures {
		rec.Exposed = append(rec.Exposed, fmt.Sprintf("%s/%d=%s", x.Proto, x.JobPort, netip.AddrPortFrom(x.PublicAddr, x.PublicPort)))
	}
	if err = g.st.RecordLeaseStart(rec); err != nil {
		g.log.Error("join refused: cannot record the lease in the state db", "err", err)
		return control.Lease{}, err
	}
	recorded = true
	g.handshakes.add(pub, time.Now())
	if err = g.wg.AddPeer(pub, l.AddrList()...); err != nil {
		return control.Lease{}, err
	}
	g.wg.CountFrom(pub, remote.Addr())
	// An admin may have ended the lease while the join built it (a kick,
	// a token revocation that listed it): ending it again here leaves
	// nothing, since whoever ended it removed the peer and the job either
	// before they were added (then this check fails) or after.
	if _, err = g.leases.Check(l.ID, secret, time.Now()); err != nil {
		g.log.Info("join undone: its lease was ended while the join ran", "lease", l.ID, "addrs", l.Addrs)
		err = g.admin.leaseGone(l.ID, err)
		g.removePeer(pub)
		recorded = false // whoever ended it recorded why
		return control.Lease{}, err
	}
	g.log.Info("job joined", "lease", l.ID, "addrs", l.Addrs, "job", req.Job.BatchJobID,
		"batch", req.Job.BatchSystem, "user", req.Job.User, "uid", req.Job.UID,
		"host", req.Job.Hostname, "token", tok.Name, "remote", remote, "egress", job.Egress, "exposed", rec.Exposed,
		"limits", !job.Limits.IsZero(), "client_version", version.Label(req.Version), "attested", o.Attested.String(), "identity", o.Issued.String())
	cl := control.Lease{
		ID:               l.ID,
		Secret:           secret,
		MTU:              g.cfg.MTU,
		GatewayPublicKey: g.wgPub,
		Endpoint:         g.advertise,
		RenewInterval:    control.Duration(g.cfg.RenewInterval),
		Expires:          l.Expires,
		Bypass:           g.jobBypass(tok.Name),
		Members:          g.fleet.members(),
	}
	g.describe(&cl, l, job)
	g.mtu.offer(&cl, remote.Addr().Unmap(), time.Now())
	return cl, nil
}

// describe fills in what the lease a join returns says of the job's
// addresses: its tunnel addresses and the gateway's (also its resolvers),
// where its flows leave from, and its exposures, each list IPv4 first.
func (g *gateway) describe(cl *control.Lease, l lease.Lease, job forward.Job) {
	for _, f := range ipfamily.All {
		for _, p := range l.Addrs {
			if f.Contains(p.Addr()) {
				cl.Addresses = append(cl.Addresses, p)
			}
		}
	}
	for _, p := range g.tunnels {
		if !l.AddrOf(ipfamily.Of(p.Addr())).IsValid() {
			continue
		}
		cl.DNS = append(cl.DNS, p.Addr())
		cl.Gateways = append(cl.Gateways, p.Addr())
	}
	for _, f := range ipfamily.All {
		for _, e := range job.Egress {
			if ipfamily.Of(e.Addr) != f {
				continue
			}
			if f == ipfamily.V4 && e.Block != (portblock.Range{}) || f == ipfamily.V6 && !e.Addr.IsUnspecified() {
				cl.PublicAddrs = append(cl.PublicAddrs, e.Addr)
			}
			if e.Block != (portblock.Range{}) && cl.Ports == ([2]uint16{}) {
				cl.Ports = [2]uint16{e.Block.Lo, e.Block.Hi}
			}
		}
	}
	for _, f := range ipfamily.All {
		for _, x := range job.Exposures {
			if x.Family() == f {
				cl.Exposed = append(cl.Exposed, control.Exposed{Port: control.Port{Proto: x.Proto, Port: x.JobPort}, PublicAddr: x.PublicAddr, PublicPort: x.PublicPort})
			}
		}
	}
}

// attributions returns where job's flows leave from as the lease history
// keeps it: its egress entries with a port block or an own address.
func attributions(job forward.Job) []store.Attribution {
	var out []store.Attribution
	for _, e := range job.Egress {
		if e.Own || e.Block != (portblock.Range{}) {
			out = append(out, store.Attribution{Addr: e.Addr, PortLo: e.Block.Lo, PortHi: e.Block.Hi, Own: e.Own})
		}
	}
	return out
}

// newLease allocates the lease of a join (allocate: admission, quotas, the
// address and port blocks) and ends the lease it replaces. Its errors are
// the ones the client sees.
func (g *gateway) newLease(req control.JoinRequest, tok store.Token, remote netip.AddrPort, pub wgkey.Key) (lease.Lease, string, error) {
	l, secret, replaced, err := g.admit.allocate(req, tok, remote, pub, time.Now())
	if replaced != nil {
		g.removePeer(replaced.PublicKey)
		g.removeJob(*replaced)
		g.recordEnd(*replaced, "replaced")
		g.log.Info("lease replaced by a new join with the same key", "lease", replaced.ID, "addrs", replaced.Addrs)
	}
	if errors.Is(err, lease.ErrNoAddress) {
		g.log.Error("join refused: tunnel subnet exhausted; widen --subnet", "subnet", g.cfg.subnet(), "leases", g.leases.Len())
		return l, "", fmt.Errorf("%w: all addresses of %s are leased (tunnel subnet); widen --subnet", control.ErrNoAddress, g.cfg.subnet())
	}
	if errors.Is(err, lease.ErrNoPortBlock) && l.Blocks > 1 {
		p := g.egress.plan
		g.log.Warn("join refused: no run of free port blocks as long as the job asks for", "blocks", l.Blocks, "block_size", p.Size,
			"used", g.leases.BlocksUsed(), "total", g.egress.pool.Blocks())
		return l, "", fmt.Errorf("%w: no %d consecutive free port blocks (%d ports) on one egress address; run the job with fewer --ports, or ask the admin to widen --egress-ports or add --egress-addr addresses",
			control.ErrNoAddress, l.Blocks, l.Blocks*p.Size)
	}
	if errors.Is(err, lease.ErrNoPortBlock) {
		p := g.egress.plan
		g.log.Error("join refused: every egress port block is in use; widen --egress-ports, lower --block-size or add --egress-addr addresses",
			"blocks", g.egress.pool.Blocks(), "egress_addrs", len(g.egress.pool.Addrs), "egress_ports", p.Range, "block_size", p.Size)
		return l, "", fmt.Errorf("%w: all %d port blocks of %s are in use; widen --egress-ports or lower --block-size, or add addresses to --egress-addr (%d now)",
			control.ErrNoAddress, g.egress.pool.Blocks(), p.Range, len(g.egress.pool.Addrs))
	}
	return l, secret, err
}

// jobOf is the egress backend's view of lease l of the job jobID, which
// joined with the token named token and asked to expose ports expose: its
// ID and addresses, where its flows of each family leave from (egressOf),
// its token and flow attribution, the limits of the config in force (the
// one place that decides a job's limits) and its exposures, checked
// against the config.
func (g *gateway) jobOf(l lease.Lease, jobID, token string, expose []control.Port) (forward.Job, error) {
	o := l.Owner
	if o.Attested != nil && o.Attested.Job != nil {
		jobID = o.Attested.Job.JobID
	}
	by, uid, jobAttested := refOf(o.Attested)
	j := forward.Job{
		ID:     jobs.ID(l.ID),
		Addrs:  l.AddrList(),
		Egress: g.egress.egressOf(l),
		Ref: jobs.Ref{JobID: jobID, Token: token,
			AttestedBy: by, AttestedUID: uid, JobAttested: jobAttested},
		Limits: g.conf.Load().Limits.ForToken(token),
	}
	if id := o.Issued; id != nil {
		j.Ref.Issuer, j.Ref.Subject = id.Issuer, id.Subject
	}
	ex, err := g.egress.planExposures(l, j.Egress, expose)
	if err == nil {
		err = g.admit.exposureAllowed(token, ex)
	}
	if err != nil {
		return forward.Job{}, err
	}
	j.Exposures = ex
	return j, nil
}

// checkFrom checks a request for lease l that came from from (invalid:
// unknown) as the join was checked: the token's source networks (airlock
// token restrict may have changed them since), and, for a lease whose
// identity was attested with the origin policy "match", the node its
// credential was made on. A lease secret taken off its node is worth
// nothing elsewhere.
func (g *gateway) checkFrom(l lease.Lease, from netip.AddrPort) error {
	if !from.IsValid() {
		return nil
	}
	o, addr := l.Owner, from.Addr().Unmap()
	if a := o.Attested; a != nil && a.Node.IsValid() && addr != a.Node.Unmap() {
		if v := g.admit.attest.v.Load(); v != nil && v.Origin != attest.OriginAny {
			return fmt.Errorf("%w: lease %s was attested for node %s; a request for it from %s is refused (a lease is good only from the node whose credential made it)",
				control.ErrAttestation, l.ID, a.Node, addr)
		}
	}
	if o.Token == "" || o.ByBearer() {
		return nil // no join token: a bearer-only job's Token is its issuer's name
	}
	tok, err := g.st.Token(o.Token)
	if err != nil || tok.AllowsFrom(addr) {
		return nil // a token that is gone is Renew's to judge
	}
	return fmt.Errorf("%w: token %s may not be used from %s: the gateway's admin restricted it to other networks; lease %s is refused from there",
		control.ErrBadToken, o.Token, addr, l.ID)
}

// addJob admits j to the egress backend and the capture taps.
func (g *gateway) addJob(j forward.Job) error {
	if err := g.backend.AddJob(j); err != nil {
		return err
	}
	g.capture.AddJob(j.ID, j.Ref)
	return nil
}

// Renew extends a lease while its token lives and no ban covers its job: a
// lease of a token that was revoked or expired meanwhile, or of a job a ban
// now covers (token-less attested leases included), ends here, whatever let
// it live.
func (g *gateway) Renew(ctx context.Context, ref control.LeaseRef) (control.RenewResponse, error) {
	now := time.Now()
	if l, err := g.leases.Check(ref.ID, ref.Secret, now); err == nil {
		// Where the request comes from, before the lease lives longer.
		if err := g.checkFrom(l, ref.From); err != nil {
			return control.RenewResponse{}, err
		}
	}
	l, err := g.leases.Renew(ref.ID, ref.Secret, now)
	if err != nil {
		return control.RenewResponse{}, g.admin.leaseGone(ref.ID, err)
	}
	o := l.Owner
	if g.admit.bearer.expired(o.Issued, now) {
		why := "the job's bearer token expired at " + o.Issued.Expires.UTC().Format(time.RFC3339) + " and no newer valid one was presented: the pilot must refresh the token file (BEARER_TOKEN_FILE, bt_u$UID) before it expires"
		g.admin.endLease(l.ID, byRenewal, why, why)
		g.log.Warn("lease ended at renewal: its bearer token expired", "lease", l.ID, "addrs", l.Addrs, "identity", o.Issued.String(), "expired", o.Issued.Expires)
		return control.RenewResponse{}, g.admin.leaseGone(l.ID, control.ErrLeaseEnded)
	}
	// A ban that covers the job (its attested uid with any token or none,
	// its token from its node, its issuer's subject) ends it here too,
	// whether or not the ban reached this gateway while the job ran (a
	// fleet's replica, a restart): a token-less lease is re-checked at
	// every renewal as a token lease is.
	g.admit.mu.Lock()
	berr := g.admit.bannedLocked(o, now)
	g.admit.mu.Unlock()
	if berr != nil {
		why := "banned"
		g.admin.endLease(l.ID, byRenewal, why, why)
		g.log.Warn("lease ended at renewal: a ban covers its job", "lease", l.ID, "addrs", l.Addrs, "token", o.Token, "err", berr)
		return control.RenewResponse{}, g.admin.leaseGone(l.ID, berr)
	}
	if o.Token == "" && !o.ByBearer() && g.admit.attest.mode() == "" {
		// Joined by its MUNGE credential alone, which this gateway no
		// longer takes in place of a token (a reload turned attested
		// identity off): as a revoked token's lease.
		why := "attested identity turned off: a job without a token must join again with one"
		g.admin.endLease(l.ID, byRenewal, why, why)
		g.log.Warn("lease ended at renewal: it joined by its MUNGE credential alone and attested identity is off now", "lease", l.ID, "addrs", l.Addrs)
		return control.RenewResponse{}, g.admin.leaseGone(l.ID, fmt.Errorf("%w: %s", control.ErrBadToken, why))
	}
	if o.Token != "" && !o.ByBearer() {
		if terr := g.admit.tokenLive(o.Token, now); errors.Is(terr, control.ErrBadToken) {
			why := "token " + o.Token + " revoked or expired"
			g.admin.endLease(l.ID, byRenewal, why, why)
			g.log.Warn("lease ended at renewal: its token is gone", "lease", l.ID, "addrs", l.Addrs, "token", o.Token, "err", terr)
			return control.RenewResponse{}, g.admin.leaseGone(l.ID, terr)
		}
	}
	return control.RenewResponse{Expires: l.Expires}, nil
}

func (g *gateway) Release(ctx context.Context, ref control.LeaseRef) error {
	if l, err := g.leases.Check(ref.ID, ref.Secret, time.Now()); err == nil {
		if err := g.checkFrom(l, ref.From); err != nil {
			return err
		}
	}
	l, err := g.leases.Release(ref.ID, ref.Secret)
	if err != nil {
		return g.admin.leaseGone(ref.ID, err)
	}
	g.removePeer(l.PublicKey)
	g.removeJob(l)
	g.recordEnd(l, "released")
	g.log.Info("job left", "lease", l.ID, "addrs", l.Addrs, "held", time.Since(l.Start).Round(time.Millisecond))
	return nil
}

func (g *gateway) Health() control.Health { return g.health() }

// byRenewal is what ended a lease the gateway ended at its renewal (its
// token revoked or expired), for kickList.
const byRenewal = "renewal"

// expireLoop frees leases whose clients stopped renewing.
func (g *gateway) expireLoop(ctx context.Context) {
	every := g.leases.TTL() / 4
	if every > 5*time.Second {
		every = 5 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			g.expire(now)
		}
	}
}

// expire frees the leases that expired at now.
func (g *gateway) expire(now time.Time) {
	ls := g.leases.Expire(now)
	g.admit.retire(ls, now)
	for _, l := range ls {
		g.removePeer(l.PublicKey)
		g.removeJob(l)
		g.recordEnd(l, "expired")
		g.log.Info("lease expired: client stopped renewing", "lease", l.ID, "addrs", l.Addrs)
	}
}

// removeJob drops l's per-job state: its lease watch, its handshake
// watch, the egress backend's state (exposures, port blocks, limits,
// flows, its addresses in the job index) and its capture attribution.
func (g *gateway) removeJob(l lease.Lease) {
	g.closeStream(l)
	g.handshakes.forget(l.PublicKey)
	g.backend.RemoveJob(jobs.ID(l.ID))
	g.capture.RemoveJob(jobs.ID(l.ID))
}

// recordEnd closes l's entry in the lease history.
func (g *gateway) recordEnd(l lease.Lease, reason string) {
	if err := g.st.RecordLeaseEnd(l.ID, time.Now(), reason); err != nil {
		g.log.Error("cannot record the end of a lease in the state db", "lease", l.ID, "err", err)
	}
}

// pruneLoop deletes lease history older than the retention period, at start
// and then hourly.
func (g *gateway) pruneLoop(ctx context.Context, keep time.Duration) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		n, err := g.st.PruneLeases(time.Now().Add(-keep))
		if err != nil {
			g.log.Error("prune lease history", "err", err)
		} else if n > 0 {
			g.log.Info("pruned lease history", "records", n, "older_than", keep)
		}
		g.fleet.logFleetHistory(keep)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
