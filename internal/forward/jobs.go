// SPDX-License-Identifier: MIT

package forward

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Jobs is the part of AddJob and RemoveJob that every backend shares. It
// checks a Job against the backend's tunnel subnets before anything
// changes, serialises AddJob and RemoveJob, adds the job's addresses to the
// job index and the job to the flow table, runs the backend's own steps
// (JobSteps) in one order, and on a failed step undoes all of it on one
// path, so that AddJob is all or nothing in every backend alike. It is
// safe for concurrent use; make it with NewJobs.
type Jobs struct {
	name    string // the backend's name, for errors
	tunnels [ipfamily.N]netip.Prefix
	subnets []netip.Prefix // tunnels, masked, in family order
	index   *jobs.Index
	flows   *flows.Table
	steps   JobSteps

	// mu serialises Add and Remove, so that each is all or nothing
	// towards the other; the backend's steps run with it held.
	mu sync.Mutex

	// byMu guards byID, which steps may read (Get) while mu is held.
	byMu sync.RWMutex
	byID map[jobs.ID]Job
}

// JobSteps are a backend's own steps of AddJob and RemoveJob. Jobs calls
// them one at a time; they may call Jobs.Get, Of and Each, not Add or
// Remove.
type JobSteps struct {
	// Add admits j, which Jobs checked, to the backend (egress, port
	// blocks, token); the job's addresses are in the index and the job
	// in the flow table already.
	Add func(j Job) error
	// SetLimits applies j's limits when they are not zero, after Add
	// (the backend's SetJobLimits).
	SetLimits func(id jobs.ID, l limits.Job) error
	// Expose opens j's exposures when it has any, last.
	Expose func(j Job) error
	// Remove undoes Add, SetLimits and Expose for j, also after any of
	// them failed half-way: it is harmless for parts never added.
	Remove func(j Job)
}

// NewJobs returns the job bookkeeping of a backend called name (for
// errors) with tunnel subnets tunnels (each the gateway's tunnel address
// with its subnet length, at most one per family), its job index and its
// flow table (nil: none). A nil index means the flow table's, or a fresh
// one without a flow table; a backend and its flow table must share one.
func NewJobs(name string, tunnels []netip.Prefix, index *jobs.Index, fl *flows.Table, steps JobSteps) (*Jobs, error) {
	switch {
	case index == nil && fl != nil:
		index = fl.Index()
	case index == nil:
		index = new(jobs.Index)
	case fl != nil && fl.Index() != index:
		return nil, fmt.Errorf("%s: the flow table has another job index than the backend", name)
	}
	r := &Jobs{name: name, index: index, flows: fl, steps: steps, byID: make(map[jobs.ID]Job)}
	for _, p := range tunnels {
		f := ipfamily.Of(p.Addr())
		if f == nil || r.tunnels[f.Index].IsValid() {
			return nil, fmt.Errorf("%s: tunnel subnets %v: want at most one valid prefix per address family", name, tunnels)
		}
		r.tunnels[f.Index] = netip.PrefixFrom(p.Addr().Unmap(), p.Bits())
		r.subnets = append(r.subnets, r.tunnels[f.Index].Masked())
	}
	return r, nil
}

// Index returns the job index.
func (r *Jobs) Index() *jobs.Index { return r.index }

// Subnets returns the gateway's tunnel subnets, masked (policy.Flow's
// Tunnels); the caller must not modify them.
func (r *Jobs) Subnets() []netip.Prefix { return r.subnets }

// Tunnel returns the gateway's tunnel address of family f with the
// subnet's length, invalid if the backend has none of f.
func (r *Jobs) Tunnel(f *ipfamily.Family) netip.Prefix { return r.tunnels[f.Index] }

// Lookup returns the job whose tunnel address is a.
func (r *Jobs) Lookup(a netip.Addr) (jobs.ID, bool) { return r.index.Lookup(a) }

// Get returns job id as AddJob took it.
func (r *Jobs) Get(id jobs.ID) (Job, bool) {
	r.byMu.RLock()
	defer r.byMu.RUnlock()
	j, ok := r.byID[id]
	return j, ok
}

// Of returns the job whose tunnel address is a, as AddJob took it.
func (r *Jobs) Of(a netip.Addr) (Job, bool) {
	id, ok := r.index.Lookup(a)
	if !ok {
		return Job{}, false
	}
	return r.Get(id)
}

// Add is AddJob: Check, then the index, the flow table, the backend's Add,
// SetLimits and Expose; on any error every step done is undone.
func (r *Jobs) Add(j Job) error {
	if err := r.Check(j); err != nil {
		return fmt.Errorf("%s: add job %s: %w", r.name, j.ID, err)
	}
	j.Addrs = unmapAll(j.Addrs)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.Get(j.ID); ok {
		return fmt.Errorf("%s: add job %s: %w", r.name, j.ID, ErrJobExists)
	}
	if err := r.index.Add(j.ID, j.Addrs...); err != nil {
		if errors.Is(err, jobs.ErrAddrInUse) || errors.Is(err, jobs.ErrExists) {
			err = fmt.Errorf("%w: %w", ErrJobExists, err)
		}
		return fmt.Errorf("%s: add job %s: %w", r.name, j.ID, err)
	}
	r.byMu.Lock()
	r.byID[j.ID] = j
	r.byMu.Unlock()
	if r.flows != nil {
		var public []netip.Addr
		for _, e := range j.Egress {
			public = append(public, e.Addr)
		}
		r.flows.AddJob(j.ID, j.Ref, public...)
	}
	err := r.steps.Add(j)
	if err == nil && !j.Limits.IsZero() {
		err = r.steps.SetLimits(j.ID, j.Limits)
	}
	if err == nil && len(j.Exposures) > 0 {
		err = r.steps.Expose(j)
	}
	if err != nil {
		r.removeLocked(j)
		return fmt.Errorf("%s: add job %s %v: %w", r.name, j.ID, j.Addrs, err)
	}
	return nil
}

// Remove is RemoveJob: the backend's Remove, then the job's flows end
// (flows.EndJob) and it leaves the flow table and the index. A no-op for
// an ID Add did not add.
func (r *Jobs) Remove(id jobs.ID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if j, ok := r.Get(id); ok {
		r.removeLocked(j)
	}
}

// removeLocked undoes Add for j. r.mu is held.
func (r *Jobs) removeLocked(j Job) {
	r.steps.Remove(j)
	if r.flows != nil {
		r.flows.CloseJob(j.ID, flows.EndJob)
		r.flows.RemoveJob(j.ID)
	}
	r.index.Remove(j.ID)
	r.byMu.Lock()
	delete(r.byID, j.ID)
	r.byMu.Unlock()
}

// All returns every job as AddJob took it.
func (r *Jobs) All() []Job {
	r.byMu.RLock()
	defer r.byMu.RUnlock()
	out := make([]Job, 0, len(r.byID))
	for _, j := range r.byID {
		out = append(out, j)
	}
	return out
}

func unmapAll(as []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, len(as))
	for i, a := range as {
		out[i] = a.Unmap()
	}
	return out
}

// Check rejects what no backend can take, before anything is changed:
// addresses outside the tunnel subnets (of a family without one:
// ErrNotSupported), two of a family, egress entries and exposures of a
// family the job has no address of, bad port blocks, limits and ports.
func (r *Jobs) Check(j Job) error {
	if j.ID == "" {
		return errors.New("no job id")
	}
	if len(j.Addrs) == 0 {
		return errors.New("no tunnel address")
	}
	var has [ipfamily.N]bool
	for _, a := range j.Addrs {
		f := ipfamily.Of(a)
		if f == nil {
			return fmt.Errorf("tunnel address %v: not an IP address", a)
		}
		a = a.Unmap()
		p := r.tunnels[f.Index]
		switch {
		case has[f.Index]:
			return fmt.Errorf("tunnel addresses %v: two of %s", j.Addrs, f)
		case !p.IsValid():
			return fmt.Errorf("%s tunnel address %v: the gateway has no %s tunnel subnet: %w", f, a, f, ErrNotSupported)
		case !p.Masked().Contains(a) || a == p.Addr() || a == p.Masked().Addr() || a.Zone() != "":
			return fmt.Errorf("tunnel address %v: want a host address of the tunnel subnet %v other than the gateway's", a, p.Masked())
		}
		has[f.Index] = true
	}
	var egress [ipfamily.N]bool
	for _, e := range j.Egress {
		if err := checkEgress(e, has, egress); err != nil {
			return err
		}
		egress[ipfamily.Of(e.Addr).Index] = true
	}
	if err := j.Limits.Validate(); err != nil {
		return err
	}
	for _, x := range j.Exposures {
		if err := CheckExposure(x); err != nil {
			return err
		}
		if !has[x.Family().Index] {
			return fmt.Errorf("expose %s/%d at %v: the job has no %s tunnel address", x.Proto, x.JobPort, x.PublicAddr, x.Family())
		}
	}
	return nil
}

// checkEgress checks e, given the families the job has addresses and
// egress entries of.
func checkEgress(e Egress, addrs, seen [ipfamily.N]bool) error {
	f := ipfamily.Of(e.Addr)
	switch {
	case f == nil:
		return errors.New("egress entry without an address")
	case !addrs[f.Index]:
		return fmt.Errorf("egress address %v: the job has no %s tunnel address", e.Addr, f)
	case seen[f.Index]:
		return fmt.Errorf("egress address %v: a second %s egress entry", e.Addr, f)
	case e.Addr.IsMulticast() || e.Addr.IsLoopback() || e.Addr.Zone() != "":
		return fmt.Errorf("egress address %v: want a unicast address", e.Addr)
	case e.Block != (portblock.Range{}) && (e.Block.Lo == 0 || e.Block.Lo > e.Block.Hi):
		return fmt.Errorf("egress %v: bad port block %s", e.Addr, e.Block)
	case e.Own && e.Block != (portblock.Range{}):
		return fmt.Errorf("egress %v: an own address keeps the job's ports, but has the port block %s", e.Addr, e.Block)
	case e.Own && e.Addr.IsUnspecified():
		return fmt.Errorf("egress %v: an own address must be an address", e.Addr)
	}
	return nil
}

// CheckExposure rejects an exposure no backend can open: not TCP or UDP,
// port 0, no public address.
func CheckExposure(x Exposure) error {
	if x.Proto != ipproto.TCP && x.Proto != ipproto.UDP {
		return fmt.Errorf("expose %d/%s: want tcp or udp", x.JobPort, x.Proto)
	}
	if x.JobPort == 0 || x.PublicPort == 0 {
		return fmt.Errorf("expose %s/%d at port %d: port 0", x.Proto, x.JobPort, x.PublicPort)
	}
	if x.Family() == nil || x.PublicAddr.IsMulticast() {
		return fmt.Errorf("expose %s/%d: public address %v: want a unicast address", x.Proto, x.JobPort, x.PublicAddr)
	}
	return nil
}
