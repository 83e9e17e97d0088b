package netstack

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/policy"
)

var _ forward.Policer = (*Stack)(nil)

// policyState is the Stack's egress policy, its jobs' token names and the
// drop counters. It is safe for concurrent use; the zero value enforces the
// zero policy.Policy.
type policyState struct {
	cur   atomic.Pointer[policy.Policy]
	drops policy.Counters

	mu     sync.RWMutex
	tokens map[netip.Addr]string
}

var zeroPolicy = &policy.Policy{}

func (p *policyState) policy() *policy.Policy {
	if c := p.cur.Load(); c != nil {
		return c
	}
	return zeroPolicy
}

func (p *policyState) token(job netip.Addr) string {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.tokens[job]
}

func (p *policyState) forget(job netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.tokens, job)
}

// SetPolicy implements forward.Policer.
func (s *Stack) SetPolicy(p *policy.Policy) error {
	if p == nil {
		p = zeroPolicy
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("user-mode egress: %w", err)
	}
	s.pol.cur.Store(p)
	return nil
}

// SetJobToken implements forward.Policer.
func (s *Stack) SetJobToken(job netip.Addr, token string) error {
	s.pol.mu.Lock()
	defer s.pol.mu.Unlock()
	if s.pol.tokens == nil {
		s.pol.tokens = make(map[netip.Addr]string)
	}
	s.pol.tokens[job.Unmap()] = token
	return nil
}

// PolicyDrops implements forward.Policer.
func (s *Stack) PolicyDrops() (map[string]uint64, error) {
	return s.pol.drops.Snapshot(), nil
}

// checkFlow decides a job's new flow from src to dst: the fixed floor
// (allowedDestination: loopback, multicast, the tunnel address but DNS, ...)
// first, then the policy with the job's token and whether dst is one of
// the gateway host's own addresses. A denial is counted under its rule and
// returned as an error wrapping ErrDestinationDenied, and reported to the
// flow table (src is the job's address and port, or echo id).
func (s *Stack) checkFlow(srcAP netip.AddrPort, proto policy.Proto, dst netip.AddrPort) error {
	src := srcAP.Addr()
	if err := allowedDestination(s.self, dst.Addr(), dst.Port()); err != nil {
		s.pol.drops.Inc(policy.RuleFloor)
		s.refuseDenied(proto, srcAP, dst, policy.RuleFloor)
		return err
	}
	f := policy.Flow{
		Token: s.pol.token(src.Unmap()),
		Proto: proto,
		Dst:   dst.Addr().Unmap(),
		Port:  dst.Port(),
		Host:  s.host.contains(dst.Addr(), time.Now()),
	}
	v := s.pol.policy().Decide(f)
	if v.Action == policy.Allow {
		return nil
	}
	s.pol.drops.Inc(v.Rule)
	s.refuseDenied(proto, srcAP, dst, v.Rule)
	return fmt.Errorf("%s %s (rule %s): %w", proto, dst, v.Rule, ErrDestinationDenied)
}
