// SPDX-License-Identifier: MIT

// Package jobs names the gateway's jobs. A job is an ID (its lease id); its
// tunnel addresses, at most one per address family, are attributes of the
// job, not its name. One Index maps every tunnel address back to its job,
// for each part that meets an address on the data path: the egress
// backends (which add and remove a job's addresses with the job), the flow
// table, the capture taps and the gateway.
package jobs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

// ID names a job: its lease id. The zero ID names no job.
type ID string

// Ref is what records and admins say about a job beside its ID. Both fields
// are what the job claimed or joined with; none is trusted for
// authorization here.
type Ref struct {
	// JobID is the batch system's job id, empty outside one.
	JobID string `json:"job_id,omitempty"`
	// Token is the name of the token the job joined with.
	Token string `json:"token,omitempty"`
	// AttestedBy names how the job's identity was attested ("munge"), ""
	// if all of it is claimed. AttestedUID is then the job's attested
	// uid, and JobAttested reports that JobID is attested too (by root
	// on the node), not only claimed.
	AttestedBy  string  `json:"attested_by,omitempty"`
	AttestedUID *uint32 `json:"attested_uid,omitempty"`
	JobAttested bool    `json:"job_attested,omitempty"`
	// Issuer and Subject are the job's identity as its issuer vouched
	// for it (a verified bearer token, source "issuer-verified"), ""
	// if it had none.
	Issuer  string `json:"issuer,omitempty"`
	Subject string `json:"subject,omitempty"`
}

// ErrAddrInUse is returned by Index.Add for an address another job holds.
var ErrAddrInUse = errors.New("tunnel address held by another job")

// ErrExists is returned by Index.Add for an ID that is already indexed.
var ErrExists = errors.New("job already indexed")

// Index maps tunnel addresses to the jobs that hold them, and jobs to their
// addresses. It is safe for concurrent use; Lookup, the data path's call,
// takes a read lock only and does not allocate. The zero value is an empty
// index.
type Index struct {
	mu     sync.RWMutex
	byAddr map[netip.Addr]ID
	addrs  map[ID][]netip.Addr
}

// Add indexes addrs as the tunnel addresses of job id. It is all or
// nothing: it fails with ErrExists if id is indexed, with ErrAddrInUse if
// another job holds one of addrs, and for an invalid id or address.
func (x *Index) Add(id ID, addrs ...netip.Addr) error {
	if id == "" {
		return errors.New("index job: empty id")
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.addrs[id]; ok {
		return fmt.Errorf("index job %s: %w", id, ErrExists)
	}
	own := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.Zone() != "" {
			return fmt.Errorf("index job %s: bad tunnel address %v", id, a)
		}
		if other, ok := x.byAddr[a]; ok || slices.Contains(own, a) {
			return fmt.Errorf("index job %s: %s (held by %v): %w", id, a, other, ErrAddrInUse)
		}
		own = append(own, a)
	}
	if x.addrs == nil {
		x.addrs = make(map[ID][]netip.Addr)
		x.byAddr = make(map[netip.Addr]ID)
	}
	x.addrs[id] = own
	for _, a := range own {
		x.byAddr[a] = id
	}
	return nil
}

// Remove forgets job id and its addresses; a no-op for an ID not indexed.
func (x *Index) Remove(id ID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, a := range x.addrs[id] {
		if x.byAddr[a] == id {
			delete(x.byAddr, a)
		}
	}
	delete(x.addrs, id)
}

// Lookup returns the job that holds tunnel address a (IPv4-mapped IPv6
// addresses are taken as IPv4).
func (x *Index) Lookup(a netip.Addr) (ID, bool) {
	x.mu.RLock()
	id, ok := x.byAddr[a.Unmap()]
	x.mu.RUnlock()
	return id, ok
}

// Addrs returns the tunnel addresses of job id, in the order Add was given
// them; nil for an ID not indexed. The slice is the caller's.
func (x *Index) Addrs(id ID) []netip.Addr {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return slices.Clone(x.addrs[id])
}

// Len returns how many jobs are indexed.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return len(x.addrs)
}
