// SPDX-License-Identifier: MIT

package netstack

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
)

// AddJob implements forward.Backend: it records the job's egress address
// and port block, its token, its limits, registers it in the flow table and
// opens its exposures; if any part fails, everything done so far is undone.
func (s *Stack) AddJob(j forward.Job) error {
	addr := j.Addr.Unmap()
	if err := s.checkJob(j); err != nil {
		return fmt.Errorf("user-mode egress: add job %s: %w", j.Addr, err)
	}
	s.jobMu.Lock()
	defer s.jobMu.Unlock()
	if s.closing.Load() {
		return fmt.Errorf("user-mode egress: add job %s: closed", addr)
	}
	if _, ok := s.jobs.lookup(addr); ok {
		return fmt.Errorf("user-mode egress: add job %s: %w", addr, forward.ErrJobExists)
	}
	if err := s.addJob(addr, j.Egress, j.Block); err != nil {
		return fmt.Errorf("user-mode egress: %w", err)
	}
	var err error
	if j.Addr6.IsValid() {
		err = s.addJob6(addr, j.Addr6, j.Egress6, j.Block6)
	}
	if err == nil {
		err = s.setJobToken(addr, j.Token)
	}
	if err == nil && s.cfg.Flows != nil {
		s.cfg.Flows.AddJob(addr, j.Ref)
		if j.Addr6.IsValid() {
			s.cfg.Flows.AddJobAlias(j.Addr6.Unmap(), addr)
		}
	}
	if err == nil && !j.Limits.IsZero() {
		err = s.SetJobLimits(addr, j.Limits)
	}
	if err == nil && len(j.Exposures) > 0 {
		err = s.expose(addr, j.Exposures)
	}
	if err != nil {
		s.removeJobLocked(addr)
		return fmt.Errorf("user-mode egress: add job %s: %w", addr, err)
	}
	return nil
}

// checkJob rejects what AddJob cannot take before anything is changed.
func (s *Stack) checkJob(j forward.Job) error {
	addr := j.Addr.Unmap()
	if !addr.IsValid() || !s.cfg.Addr.Masked().Contains(addr) || addr == s.self {
		return fmt.Errorf("job address %v: want a host address of the tunnel subnet %v other than the gateway's", j.Addr, s.cfg.Addr.Masked())
	}
	if (j.Addr6.IsValid() || j.Egress6.IsValid()) && !s.cfg.Addr6.IsValid() {
		return fmt.Errorf("ipv6 tunnel address %v, egress %v: this netstack has no IPv6 tunnel address: %w", j.Addr6, j.Egress6, forward.ErrNotSupported)
	}
	if j.Egress6.IsValid() && !j.Addr6.IsValid() {
		return fmt.Errorf("ipv6 egress address %v without an ipv6 tunnel address", j.Egress6)
	}
	if err := j.Limits.Validate(); err != nil {
		return err
	}
	for _, x := range j.Exposures {
		if err := checkExposure(x); err != nil {
			return err
		}
	}
	return nil
}

// RemoveJob implements forward.Backend: it closes the job's exposures, ends
// its open flows (flows.EndJob, which closes them) and forgets it.
func (s *Stack) RemoveJob(addr netip.Addr) {
	s.jobMu.Lock()
	defer s.jobMu.Unlock()
	s.removeJobLocked(addr.Unmap())
}

// removeJobLocked undoes AddJob; it is harmless for parts that were never
// added. jobMu is held.
func (s *Stack) removeJobLocked(addr netip.Addr) {
	s.unexpose(addr)
	s.removeJob(addr)
	if s.cfg.Flows != nil {
		s.cfg.Flows.CloseJob(addr, flows.EndJob)
		s.cfg.Flows.RemoveJob(addr)
	}
}

// Stats implements forward.Backend.
func (s *Stack) Stats() (forward.Stats, error) {
	if s.closing.Load() {
		return forward.Stats{}, errors.New("user-mode egress: closed")
	}
	return forward.Stats{
		Limits:        s.limitStats(),
		PolicyDrops:   s.policyDrops(),
		BlockRefusals: s.stats.blockExhausted.Load(),
	}, nil
}
