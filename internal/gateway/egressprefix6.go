package gateway

import (
	"fmt"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/lease"
)

// checkEgressPrefix6 validates --egress-prefix6: an IPv6 prefix of at
// most /96, so that every IPv4 tunnel address of subnet has its own
// address in it.
func checkEgressPrefix6(p, subnet netip.Prefix) error {
	if err := lease.CheckPrefix6(p); err != nil {
		return fmt.Errorf("--egress-prefix6: %w", err)
	}
	a := p.Addr()
	if a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() {
		return fmt.Errorf("--egress-prefix6 %s: want a routed unicast prefix", p)
	}
	return nil
}

// ownAddr6 returns the job's own public IPv6 address in --egress-prefix6:
// the one that embeds its IPv4 tunnel address, like its IPv6 tunnel
// address.
func (g *gateway) ownAddr6(l lease.Lease) netip.Addr {
	return lease.Embed6(g.v6.own, l.Addr)
}
