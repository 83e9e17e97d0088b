package gateway

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

var _ admin.Gateway = (*gateway)(nil)

// Status implements admin.Gateway.
func (g *gateway) Status() admin.Status {
	now := time.Now()
	p := g.egress.plan
	total := g.egress.pool.Blocks()
	st := admin.Status{
		Mode: g.egress.mode, Started: g.started, UptimeSeconds: now.Sub(g.started).Seconds(),
		Advertise: g.advertise, EgressAddr: g.egress.public,
		PortBlocks: admin.PortBlocks{Range: p.Range.String(), Size: p.Size, Total: total, Addrs: len(g.egress.pool.Addrs)},
		Jobs:       []admin.JobStatus{},
		Draining:   g.tr.draining.Load(),
		Capacity:   admin.Capacity{Jobs: g.capacity.Jobs, Bound: g.capacity.Bound, Hint: g.capacity.Hint},
	}
	byAddr := map[string]flows.JobStats{}
	if g.flows != nil {
		for _, js := range g.flows.Jobs() {
			byAddr[js.Addr.String()] = js
		}
		st.Totals = g.flows.Stats()
	}
	for _, l := range g.leases.Leases() {
		o, _ := l.Owner.(owner)
		js, ok := byAddr[l.Addr.String()]
		if !ok {
			js = flows.JobStats{Addr: l.Addr, JobRef: flows.JobRef{Lease: l.ID, JobID: o.Job.BatchJobID, Token: o.Token}}
		}
		j := admin.JobStatus{JobStats: js, Host: o.Job.Hostname, User: o.Job.User, Started: l.Start, Expires: l.Expires,
			Transport: g.transportOf(l.ID)}
		if o.Remote.IsValid() {
			j.Remote = o.Remote.String()
		}
		if b := g.block(l); b != (portblock.Range{}) {
			j.Ports = b.String()
			j.PublicAddr = g.blockAddr(l)
			st.PortBlocks.Used += max(l.Blocks, 1)
		}
		st.Jobs = append(st.Jobs, j)
	}
	st.PortBlocks.Free = st.PortBlocks.Total - st.PortBlocks.Used
	return st
}

// Flows implements admin.Gateway.
func (g *gateway) Flows(f flows.Filter, activeOnly bool) admin.FlowList {
	if g.flows == nil {
		return admin.FlowList{Active: []flows.Record{}}
	}
	fl := admin.FlowList{Active: g.flows.Active(f)}
	if !activeOnly {
		fl.Recent = g.flows.Recent(f)
	}
	return fl
}

// Kick implements admin.Gateway: it ends the lease whose id or tunnel
// address is req.Job, else the one lease whose batch job id is req.Job
// (refusing, with a list, when several claim it: batch job ids come from
// the clients), as if it had expired, and remembers it so that its
// client learns why (control.ErrLeaseEnded) at once over its watch and at
// any later request. With req.Ban, joins from the job's token and host are
// refused for that long.
func (g *gateway) Kick(req admin.KickRequest) (admin.KickResult, error) {
	var res admin.KickResult
	var byID, byBatch []lease.Lease
	for _, l := range g.leases.Leases() {
		o, _ := l.Owner.(owner)
		switch {
		case l.ID == req.Job || l.Addr.String() == req.Job || l.Addr6.IsValid() && l.Addr6.String() == req.Job:
			byID = append(byID, l)
		case o.Job.BatchJobID != "" && o.Job.BatchJobID == req.Job:
			byBatch = append(byBatch, l)
		}
	}
	match := byID
	if len(match) == 0 {
		match = byBatch
	}
	if len(match) == 0 {
		return res, fmt.Errorf("%w %q: no live lease has that batch job id, lease id or tunnel address (airlock status lists them)", admin.ErrNoSuchJob, req.Job)
	}
	if len(match) > 1 {
		var list []string
		for _, l := range match {
			o, _ := l.Owner.(owner)
			list = append(list, fmt.Sprintf("lease %s at %s (host %q, user %q, token %s, since %s)",
				l.ID, l.Addr, o.Job.Hostname, o.Job.User, o.Token, l.Start.UTC().Format(time.RFC3339)))
		}
		return res, fmt.Errorf("%w: %d live leases claim batch job id %q; kick one by its lease id or tunnel address: %s",
			admin.ErrAmbiguousJob, len(match), req.Job, strings.Join(list, "; "))
	}
	var ban time.Duration
	if req.Ban != "" {
		d, err := time.ParseDuration(req.Ban)
		if err != nil || d <= 0 {
			return res, fmt.Errorf("bad ban %q: want a positive duration", req.Ban)
		}
		ban = d
	}
	why := "kicked by admin"
	if req.Reason != "" {
		why += ": " + req.Reason
	}
	l := match[0]
	o, _ := l.Owner.(owner)
	if ban > 0 {
		res.BannedUntil = g.ban(o, ban, req.Reason)
	}
	k, ok := g.endLease(l.ID, "airlock kick", req.Reason, why)
	if !ok {
		return res, fmt.Errorf("%w %q: its lease ended meanwhile", admin.ErrNoSuchJob, req.Job)
	}
	g.log.Warn("job kicked by admin: lease ended", "lease", l.ID, "addr", l.Addr, "job", o.Job.BatchJobID, "reason", req.Reason, "ban", ban)
	res.Kicked = append(res.Kicked, k)
	return res, nil
}

// EndTokenLeases implements admin.Gateway: it ends every live lease of
// the token named, as a kick does, when the token is revoked.
func (g *gateway) EndTokenLeases(name, reason string) []admin.KickedLease {
	var out []admin.KickedLease
	for _, l := range g.leases.Leases() {
		if o, _ := l.Owner.(owner); o.Token != name {
			continue
		}
		if k, ok := g.endLease(l.ID, "airlock token revoke", reason, reason); ok {
			g.log.Warn("token revoked: lease ended", "lease", l.ID, "addr", l.Addr, "token", name)
			out = append(out, k)
		}
	}
	return out
}

// endLease ends lease id on an admin's order (by: the command), frees it
// as if it had expired and records why in the history; its client is
// told at once over its watch, and at any later request, with reason.
func (g *gateway) endLease(id, by, reason, why string) (admin.KickedLease, bool) {
	g.kicks.add(id, by, reason, g.leases.TTL())
	l, err := g.leases.Remove(id)
	if err != nil {
		return admin.KickedLease{}, false // ended meanwhile
	}
	g.removePeer(l.PublicKey)
	g.removeJob(l)
	g.recordEnd(l, why)
	if g.wakeWatches != nil {
		g.wakeWatches(l.ID)
	}
	o, _ := l.Owner.(owner)
	return admin.KickedLease{Lease: l.ID, JobID: o.Job.BatchJobID, Addr: l.Addr, Token: o.Token, Host: o.Job.Hostname}, true
}

// kickList remembers kicked leases for a while, so that their clients'
// renewals are told why their lease is gone. It is safe for concurrent
// use; the zero value is empty.
type kickList struct {
	mu sync.Mutex
	m  map[string]kick
}

type kick struct {
	at, forget time.Time
	by, reason string
}

// add remembers lease id as ended by the admin command by for keep (at
// least a minute).
func (k *kickList) add(id, by, reason string, keep time.Duration) {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[string]kick)
	}
	for id, e := range k.m {
		if now.After(e.forget) {
			delete(k.m, id)
		}
	}
	k.m[id] = kick{at: now, forget: now.Add(max(2*keep, time.Minute)), by: by, reason: reason}
}

// err returns the error for a request about a kicked lease id, nil if it
// was not kicked.
func (k *kickList) err(id string) error {
	k.mu.Lock()
	e, ok := k.m[id]
	k.mu.Unlock()
	if !ok {
		return nil
	}
	why := ""
	if e.reason != "" {
		why = ": " + e.reason
	}
	return fmt.Errorf("%w: ended by the gateway's admin (%s) at %s%s", control.ErrLeaseEnded, e.by, e.at.UTC().Format(time.RFC3339), why)
}

// leaseGone is the error for a renewal or release of a lease the manager
// does not know: kicked, or unknown.
func (g *gateway) leaseGone(id string, err error) error {
	if kerr := g.kicks.err(id); kerr != nil {
		return kerr
	}
	return fmt.Errorf("%w: %w", control.ErrUnknownLease, err)
}

// durationOf converts nanoseconds.
func durationOf(ns int64) time.Duration { return time.Duration(ns) }
