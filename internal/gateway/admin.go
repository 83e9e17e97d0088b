// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

var _ admin.Gateway = (*adminGateway)(nil)

// adminGateway is the gateway's admin part: what the admin socket asks of
// it (admin.Gateway, admin.KeyRotator, admin.Backuper) and the state that
// only admins' orders change. It is safe for concurrent use once g is set
// (newGateway).
type adminGateway struct {
	g *gateway
	// kicks remembers leases an admin ended.
	kicks kickList
	// reloadMu serialises reloads of the config (config.go).
	reloadMu sync.Mutex
	// rotateMu serialises TLS key rotation steps (RotateKey).
	rotateMu sync.Mutex
}

// Status implements admin.Gateway.
func (ag *adminGateway) Status() admin.Status {
	now := time.Now()
	p := ag.g.egress.plan
	total := ag.g.egress.pool.Blocks()
	pin, next := ag.g.res.ids.Pins()
	st := admin.Status{
		Version: ag.g.cfg.Version,
		Pin:     pin,
		NextPin: next,
		Mode:    ag.g.egress.mode, Started: ag.g.started, UptimeSeconds: now.Sub(ag.g.started).Seconds(),
		Advertise: ag.g.advertise, EgressAddr: ag.g.egress.public,
		PortBlocks: admin.PortBlocks{Range: p.Range.String(), Size: p.Size, Total: total, Addrs: len(ag.g.egress.pool.Addrs)},
		Jobs:       []admin.JobStatus{},
		Draining:   ag.g.tr.draining.Load(),
		Capacity:   admin.Capacity{Jobs: ag.g.egress.capacity.Jobs, Bound: ag.g.egress.capacity.Bound, Hint: ag.g.egress.capacity.Hint},
		UDP:        ag.g.udpStats(),
	}
	byID := map[jobs.ID]flows.JobStats{}
	if ag.g.flows != nil {
		for _, js := range ag.g.flows.Jobs() {
			byID[js.Lease] = js
		}
		st.Totals = ag.g.flows.Stats()
	}
	for _, l := range ag.g.leases.Leases() {
		o := l.Owner
		js, ok := byID[jobs.ID(l.ID)]
		if !ok {
			by, uid, jobAttested := refOf(o.Attested)
			js = flows.JobStats{Addr: l.Addr(), Lease: jobs.ID(l.ID), Ref: jobs.Ref{JobID: o.Claimed.BatchJobID, Token: o.Token,
				AttestedBy: by, AttestedUID: uid, JobAttested: jobAttested}}
			if id := o.Issued; id != nil {
				js.Ref.Issuer, js.Ref.Subject = id.Issuer, id.Subject
			}
		}
		j := admin.JobStatus{JobStats: js, Host: o.Claimed.Hostname, User: o.Claimed.User, ClaimedUID: o.Claimed.UID, Attested: o.Attested, Issued: o.Issued,
			Started: l.Start, Expires: l.Expires, Transport: ag.g.transportOf(l.ID), Addrs: l.AddrList()}
		if o.Remote.IsValid() {
			j.Remote = o.Remote.String()
		}
		if b := ag.g.egress.block(l); b != (portblock.Range{}) {
			j.Ports = b.String()
			j.PublicAddr = ag.g.egress.blockAddr(l)
			st.PortBlocks.Used += max(l.Blocks, 1)
		}
		st.Jobs = append(st.Jobs, j)
	}
	st.PortBlocks.Free = st.PortBlocks.Total - st.PortBlocks.Used
	return st
}

// Flows implements admin.Gateway.
func (ag *adminGateway) Flows(f flows.Filter, activeOnly bool) admin.FlowList {
	if ag.g.flows == nil {
		return admin.FlowList{Active: []flows.Record{}}
	}
	fl := admin.FlowList{Active: ag.g.flows.Active(f)}
	if !activeOnly {
		fl.Recent = ag.g.flows.Recent(f)
	}
	return fl
}

// Leases implements admin.Gateway.
func (ag *adminGateway) Leases() []admin.LiveLease {
	// Let the joins that are allocating finish first: a revoke lists its
	// token's leases after deleting the token, so every join either shows
	// here or sees the token gone (allocate).
	ag.g.admit.mu.Lock()
	ag.g.admit.mu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
	ls := ag.g.leases.Leases()
	out := make([]admin.LiveLease, 0, len(ls))
	for _, l := range ls {
		o := l.Owner
		ll := admin.LiveLease{ID: l.ID, Addrs: l.AddrList(), JobID: o.Claimed.BatchJobID, Host: o.Claimed.Hostname,
			User: o.Claimed.User, Token: o.Token, Start: l.Start, Attested: o.Attested, Issued: o.Issued}
		if o.Attested != nil && o.Attested.Job != nil {
			ll.JobID, ll.JobAttested = o.Attested.Job.JobID, true
		}
		out = append(out, ll)
	}
	return out
}

// Ban implements admin.Gateway: joins from l's token, host and client
// network are refused for d, and the other live leases of that token from
// that host or network end.
func (ag *adminGateway) Ban(l admin.LiveLease, d time.Duration, reason string) (time.Time, string) {
	var o identity.Job
	if ll, ok := ag.g.leases.ByID(l.ID); ok {
		o = ll.Owner
	} else {
		o = identity.Job{Claimed: identity.Claimed{Hostname: l.Host}, Token: l.Token}
	}
	b, covers := ag.g.admit.ban(o, d, reason)
	ag.g.fleet.endBanned(b, l.ID) // the kick ends l itself
	return b.Until, covers
}

// SetDraining implements admin.Gateway.
func (ag *adminGateway) SetDraining(on bool) bool { return ag.g.tr.draining.Swap(on) }

// Reload implements admin.Gateway.
func (ag *adminGateway) Reload() (admin.ReloadResult, error) { return ag.reload() }

// EndLease implements admin.Gateway.
func (ag *adminGateway) EndLease(id, by, reason, why string) (admin.KickedLease, bool) {
	return ag.endLease(id, by, reason, why)
}

// endLease ends lease id on an admin's order (by: the command), frees it
// as if it had expired and records why in the history; its client is
// told at once over its watch, and at any later request, with reason.
func (ag *adminGateway) endLease(id, by, reason, why string) (admin.KickedLease, bool) {
	ag.kicks.add(id, by, reason, ag.g.leases.TTL())
	l, err := ag.g.leases.Remove(id)
	if err != nil {
		return admin.KickedLease{}, false // ended meanwhile
	}
	ag.g.removePeer(l.PublicKey)
	ag.g.removeJob(l)
	ag.g.recordEnd(l, why)
	if ag.g.wakeWatches != nil {
		ag.g.wakeWatches(l.ID)
	}
	o := l.Owner
	return admin.KickedLease{Lease: l.ID, JobID: o.Claimed.BatchJobID, Addr: l.Addr(), Token: o.Token, Host: o.Claimed.Hostname}, true
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
	if e.by == byRenewal {
		return fmt.Errorf("%w: ended by the gateway at its renewal at %s%s", control.ErrLeaseEnded, e.at.UTC().Format(time.RFC3339), why)
	}
	return fmt.Errorf("%w: ended by the gateway's admin (%s) at %s%s", control.ErrLeaseEnded, e.by, e.at.UTC().Format(time.RFC3339), why)
}

// leaseGone is the error for a renewal or release of a lease the manager
// does not know: kicked, or unknown.
func (ag *adminGateway) leaseGone(id string, err error) error {
	if kerr := ag.kicks.err(id); kerr != nil {
		return kerr
	}
	return fmt.Errorf("%w: %w", control.ErrUnknownLease, err)
}

// durationOf converts nanoseconds.
func durationOf(ns int64) time.Duration { return time.Duration(ns) }
