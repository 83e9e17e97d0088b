// SPDX-License-Identifier: MIT

package netstack

// Dual stack. A job has an IPv4 tunnel address, which names it everywhere
// in the Stack (limits, policy token, DNS limits, exposures), and, when
// the gateway gives it one, an IPv6 tunnel address (forward.Job.Addr6). The jobs
// table holds an entry for each address, since the two families leave
// from different egress addresses; every other per-job lookup maps an
// IPv6 source to the job's IPv4 address first (jobOf). Config.Addr6 is
// the gateway's IPv6 tunnel address: the netstack owns it, and a second
// DNS server listens on it.

import (
	"fmt"
	"net/netip"
	"sync"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// dualStack maps jobs' IPv6 tunnel addresses to their IPv4 ones and back.
// It is safe for concurrent use; the zero value is empty.
type dualStack struct {
	mu  sync.RWMutex
	to4 map[netip.Addr]netip.Addr
	to6 map[netip.Addr]netip.Addr
}

func (d *dualStack) set(a4, a6 netip.Addr) (old6 netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.to4 == nil {
		d.to4 = make(map[netip.Addr]netip.Addr)
		d.to6 = make(map[netip.Addr]netip.Addr)
	}
	old6 = d.to6[a4]
	if old6.IsValid() {
		delete(d.to4, old6)
	}
	d.to4[a6] = a4
	d.to6[a4] = a6
	return old6
}

// remove forgets the job at a4 and returns its IPv6 address (zero: none).
func (d *dualStack) remove(a4 netip.Addr) netip.Addr {
	d.mu.Lock()
	defer d.mu.Unlock()
	a6, ok := d.to6[a4]
	if !ok {
		return netip.Addr{}
	}
	delete(d.to6, a4)
	delete(d.to4, a6)
	return a6
}

func (d *dualStack) v6(a4 netip.Addr) netip.Addr {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.to6[a4]
}

// jobOf returns the address that names the job with tunnel address a: a
// itself, or for a job's IPv6 address its IPv4 one.
func (s *Stack) jobOf(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if !a.Is6() {
		return a
	}
	s.dual.mu.RLock()
	defer s.dual.mu.RUnlock()
	if a4, ok := s.dual.to4[a]; ok {
		return a4
	}
	return a
}

// addJob6 adds the IPv6 side of the job at job (AddJob): its IPv6 flows
// leave from egress6 (the zero Addr: the host's choice per destination)
// with a source port from block (the zero Range: any port).
func (s *Stack) addJob6(job, addr6, egress6 netip.Addr, block portblock.Range) error {
	job, addr6, egress6 = job.Unmap(), addr6.Unmap(), egress6.Unmap()
	switch {
	case !s.cfg.Addr6.IsValid():
		return fmt.Errorf("add job %s: ipv6 address %s: the netstack has no IPv6 tunnel address", job, addr6)
	case !addr6.Is6() || !s.cfg.Addr6.Contains(addr6) || addr6 == s.cfg.Addr6.Addr():
		return fmt.Errorf("add job %s: ipv6 address %s not a job address of %s", job, addr6, s.cfg.Addr6.Masked())
	case egress6.IsValid() && (!egress6.Is6() || egress6.IsMulticast()):
		return fmt.Errorf("add job %s: bad ipv6 egress address %s", job, egress6)
	case block != (portblock.Range{}) && block.Lo > block.Hi:
		return fmt.Errorf("add job %s: bad port block %s", job, block)
	}
	if _, ok := s.jobs.lookup(job); !ok {
		return fmt.Errorf("add job %s: %w", job, forward.ErrUnknownJob)
	}
	if egress6.IsUnspecified() {
		egress6 = netip.Addr{}
	}
	if old := s.dual.set(job, addr6); old.IsValid() && old != addr6 {
		s.jobs.remove(old)
	}
	s.jobs.set(addr6, jobEgress{addr: egress6, block: block})
	return nil
}

// removeJob6 drops the IPv6 side of the job at job (RemoveJob).
func (s *Stack) removeJob6(job netip.Addr) {
	a6 := s.dual.remove(job)
	if !a6.IsValid() {
		return
	}
	s.jobs.remove(a6)
	if s.dns6 != nil {
		s.dns6.RemoveJob(a6)
	}
}
