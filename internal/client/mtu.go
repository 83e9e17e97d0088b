// SPDX-License-Identifier: MIT

package client

import (
	"context"

	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// takePathMTU chooses the job's tunnel MTU before its TUN is made: the
// larger one the gateway offers (control.Lease.MaxMTU) if a probe of that
// size goes to the gateway and back over UDP (tunnel.ProbeMTU), else the
// lease's MTU. The job keeps it for its life (its TUN's MTU and its TCP
// connections' MSS are set once); see recheckPathMTU for later gateways.
// With --transport tcp nothing is probed: the stream carries any size,
// and UDP may be blocked.
func (s *Session) takePathMTU(ctx context.Context) {
	ls := s.lease
	if s.transport == TransportTCP || ls.MaxMTU <= ls.MTU {
		s.tunMTU = ls.MTU
		return
	}
	m, err := tunnel.ProbeMTU(ctx, tunnel.ProbeConfig{Endpoint: s.endpoint, Token: ls.MTUProbe, Max: ls.MaxMTU, Fallback: ls.MTU})
	switch {
	case err != nil:
		s.log.Info("tunnel mtu: the path's larger mtu is not proven; keeping the lease's", "mtu", m, "offered", ls.MaxMTU, "gateway", s.cur.addr, "why", err)
	case m > ls.MTU:
		s.log.Info("tunnel mtu follows the path to the gateway", "mtu", m, "lease_mtu", ls.MTU, "offered", ls.MaxMTU, "gateway", s.cur.addr)
	}
	s.tunMTU = m
	s.lease.MTU = m
}

// recheckPathMTU probes the path to a new gateway or lease (a failover, a
// rejoin) at the job's tunnel MTU, which cannot change under the job's
// open connections: if that path does not carry it, the job is told how
// big packets will be lost.
func (s *Session) recheckPathMTU(ctx context.Context) {
	ls := s.lease
	if s.tunMTU <= ls.MTU {
		s.lease.MTU = max(s.tunMTU, ls.MTU)
		return
	}
	s.lease.MTU = s.tunMTU
	if s.using == TransportTCP {
		return
	}
	m, err := tunnel.ProbeMTU(ctx, tunnel.ProbeConfig{Endpoint: s.endpoint, Token: ls.MTUProbe, Max: min(ls.MaxMTU, s.tunMTU), Fallback: ls.MTU})
	if m < s.tunMTU {
		s.log.Warn("the path to this gateway does not carry the job's tunnel mtu: packets larger than the path's are lost (TCP connections opened from now on are unaffected only if they negotiate a smaller MSS)",
			"job_mtu", s.tunMTU, "path_mtu", m, "gateway", s.cur.addr, "why", err)
	}
}
