package gateway

import (
	"fmt"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/flows"
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
			st.PortBlocks.Used++
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

// Kick implements admin.Gateway: it ends every lease whose id, tunnel
// address or batch job id is job, as if it had expired, and remembers it
// so that the client's next renewal learns why (control.ErrLeaseEnded).
func (g *gateway) Kick(job, reason string) (admin.KickResult, error) {
	var res admin.KickResult
	for _, l := range g.leases.Leases() {
		o, _ := l.Owner.(owner)
		if l.ID != job && l.Addr.String() != job && (o.Job.BatchJobID == "" || o.Job.BatchJobID != job) {
			continue
		}
		l, err := g.leases.Remove(l.ID)
		if err != nil {
			continue // ended meanwhile
		}
		g.kicks.add(l.ID, reason, g.leases.TTL())
		g.removePeer(l.PublicKey)
		g.removeJob(l)
		why := "kicked by admin"
		if reason != "" {
			why += ": " + reason
		}
		g.recordEnd(l, why)
		g.log.Warn("job kicked by admin: lease ended", "lease", l.ID, "addr", l.Addr, "job", o.Job.BatchJobID, "reason", reason)
		res.Kicked = append(res.Kicked, admin.KickedLease{Lease: l.ID, JobID: o.Job.BatchJobID, Addr: l.Addr})
	}
	if len(res.Kicked) == 0 {
		return res, fmt.Errorf("%w %q: no live lease has that batch job id, lease id or tunnel address (airlock status lists them)", admin.ErrNoSuchJob, job)
	}
	return res, nil
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
	reason     string
}

// add remembers lease id as kicked for keep (at least a minute).
func (k *kickList) add(id, reason string, keep time.Duration) {
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
	k.m[id] = kick{at: now, forget: now.Add(max(2*keep, time.Minute)), reason: reason}
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
	return fmt.Errorf("%w: ended by the gateway's admin (airlock kick) at %s%s", control.ErrLeaseEnded, e.at.UTC().Format(time.RFC3339), why)
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
