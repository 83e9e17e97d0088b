// SPDX-License-Identifier: MIT

package netstack

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/policy"
)

// policyState is the Stack's egress policy and the drop counters (jobs'
// tokens are in their jobState). It is safe for concurrent use; the zero
// value enforces the zero policy.Policy.
type policyState struct {
	cur   atomic.Pointer[policy.Policy]
	drops policy.Counters
}

var zeroPolicy = &policy.Policy{}

func (p *policyState) policy() *policy.Policy {
	if c := p.cur.Load(); c != nil {
		return c
	}
	return zeroPolicy
}

// SetPolicy implements forward.Backend.
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

// policyDrops returns the denials per rule (Stats.PolicyDrops).
func (s *Stack) policyDrops() map[string]uint64 {
	return s.pol.drops.Snapshot()
}

// checkFlow decides a job's new flow from src to dst with the policy
// (policy.Decide): first the built-in floor (policy.Builtin: loopback,
// multicast, the tunnel subnet, ...), then the rules, with the job's token,
// the tunnel subnet and whether dst (or an IPv4 address it embeds) is one
// of the gateway host's own addresses. A denial is counted under its rule
// and returned as an error wrapping ErrDestinationDenied, and reported to
// the flow table (src is the job's address and port, or echo id).
//
// DNS to the tunnel address and echo requests to it never get here: the
// netstack's own endpoints take them first.
func (s *Stack) checkFlow(srcAP netip.AddrPort, proto policy.Proto, dst netip.AddrPort) error {
	src := srcAP.Addr()
	a := dst.Addr().Unmap()
	now := time.Now()
	host := s.host.contains(a, now)
	if v4, _, n := policy.Embedded(a); !host && n > 0 {
		for i := 0; i < n; i++ {
			host = host || s.host.contains(v4[i], now)
		}
	}
	f := policy.Flow{
		Proto:   proto,
		Dst:     a,
		Port:    dst.Port(),
		Host:    host,
		Tunnels: s.reg.Subnets(),
	}
	if j := s.jobOf(src); j != nil {
		f.Token = j.token
	}
	v := s.pol.policy().Decide(f)
	if v.Action == policy.Allow {
		return nil
	}
	s.pol.drops.Inc(v.Rule)
	s.refuseDenied(proto, srcAP, dst, v.Rule)
	return fmt.Errorf("%s %s (rule %s): %w", proto, dst, v.Rule, ErrDestinationDenied)
}
