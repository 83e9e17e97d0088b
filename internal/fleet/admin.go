// SPDX-License-Identifier: MIT

package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

// The fleet's admin operations, from the database alone: a gateway's admin
// socket answers them through its node, and an admin host that reaches only
// the database runs them with airlock … --store URL.

// Status is the fleet as the database knows it.
type Status struct {
	// Now is the database's clock, which heartbeats are compared with.
	Now     time.Time      `json:"now"`
	Members []MemberStatus `json:"members"`
	// History is what the lease history keeps.
	History pgstore.HistoryStats `json:"history"`
}

// MemberStatus is one gateway with its live leases.
type MemberStatus struct {
	store.Member
	// Alive is false when the gateway stopped or has not heartbeated for
	// MemberStale.
	Alive  bool                `json:"alive"`
	Leases []store.LeaseRecord `json:"leases"`
}

// FleetStatus returns every registered gateway and the live leases it
// recorded (a gateway that died holds its last leases until a restart
// closes them).
func FleetStatus(db *pgstore.Store) (Status, error) {
	ms, err := db.Members()
	if err != nil {
		return Status{}, err
	}
	now, err := db.Now()
	if err != nil {
		return Status{}, err
	}
	byGW, err := db.LiveLeasesByMember()
	if err != nil {
		return Status{}, err
	}
	st := Status{Now: now, Members: []MemberStatus{}}
	for _, m := range ms {
		ls := byGW[m.ID]
		if ls == nil {
			ls = []store.LeaseRecord{}
		}
		st.Members = append(st.Members, MemberStatus{Member: m, Alive: m.Alive(now, MemberStale), Leases: ls})
	}
	st.History, err = db.HistoryStats()
	return st, err
}

// Errors of FindLease.
var (
	ErrNoSuchJob    = errors.New("no such job in the fleet")
	ErrAmbiguousJob = errors.New("several leases in the fleet match")
)

// FindLease returns the one live lease of the fleet that job names: its
// lease id, else its tunnel address or batch job id (which may name
// leases of several gateways: then the error lists them).
func FindLease(db *pgstore.Store, job string) (store.LeaseRecord, error) {
	live, err := db.LiveLeases("")
	if err != nil {
		return store.LeaseRecord{}, err
	}
	var byID, other []store.LeaseRecord
	for _, r := range live {
		switch {
		case r.ID == job:
			byID = append(byID, r)
		case slices.ContainsFunc(r.TunnelAddrs, func(a netip.Addr) bool { return a.String() == job }) || r.JobID != "" && r.JobID == job:
			other = append(other, r)
		}
	}
	match := byID
	if len(match) == 0 {
		match = other
	}
	switch len(match) {
	case 0:
		return store.LeaseRecord{}, fmt.Errorf("%w %q: no live lease of any gateway has that lease id, tunnel address or batch job id (airlock status --fleet lists them)", ErrNoSuchJob, job)
	case 1:
		return match[0], nil
	}
	var list []string
	for _, r := range match {
		list = append(list, fmt.Sprintf("lease %s on gateway %s (host %q, address %s)", r.ID, r.Gateway, r.Host, r.TunnelAddr()))
	}
	return store.LeaseRecord{}, fmt.Errorf("%w %q: kick one by its lease id: %s", ErrAmbiguousJob, job, strings.Join(list, "; "))
}

// Kick asks the gateway that holds job's lease to end it (and, with ban >
// 0, to ban the job's token from its host fleet-wide) and waits up to
// timeout for its answer.
func Kick(ctx context.Context, db *pgstore.Store, job, reason string, ban time.Duration, by string, timeout time.Duration) (store.LeaseRecord, pgstore.KickResult, error) {
	r, err := FindLease(db, job)
	if err != nil {
		return r, pgstore.KickResult{}, err
	}
	gw, err := holder(db, r)
	if err != nil {
		return r, pgstore.KickResult{}, err
	}
	id, err := db.RequestKick(pgstore.Kick{Lease: r.ID, Gateway: gw.ID, Reason: reason, Ban: ban, By: by})
	if err != nil {
		return r, pgstore.KickResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := db.WaitKick(ctx, id)
	if err != nil {
		return r, res, fmt.Errorf("%w (gateway %s; it ends the lease when it next reaches the database)", err, r.Gateway)
	}
	return r, res, nil
}

// holder returns the member that recorded lease r (by its member id, which
// key rotations and restarts keep).
func holder(db *pgstore.Store, r store.LeaseRecord) (store.Member, error) {
	id, err := db.LeaseMember(r.ID)
	if err != nil {
		return store.Member{}, err
	}
	ms, err := db.Members()
	if err != nil {
		return store.Member{}, err
	}
	for _, m := range ms {
		if m.ID == id {
			return m, nil
		}
	}
	return store.Member{}, fmt.Errorf("gateway %s (member %s) of lease %s is not registered in the fleet", r.Gateway, id, r.ID)
}
