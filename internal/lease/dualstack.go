// SPDX-License-Identifier: MIT

package lease

import (
	"fmt"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// Dual stack: a job's IPv6 tunnel address is not allocated but derived from
// its IPv4 one. The Manager's IPv6 prefix (at most /96) holds the IPv4
// address in its last 32 bits, e.g. fd12:3456:789a::6440:2 for 100.64.0.2
// in fd12:3456:789a::/48. The IPv6 address is therefore unique whenever
// the IPv4 one is, needs no state of its own, and comes back with the IPv4
// address when a lease is restored after a restart (as long as the prefix
// is kept, which the gateway does in its state directory).

// MaxPrefix6Bits is the longest IPv6 prefix that leaves room for an
// embedded IPv4 address.
const MaxPrefix6Bits = 96

// Embed6 returns the IPv6 address of prefix p that embeds the IPv4 address
// a in its last 32 bits.
func Embed6(p netip.Prefix, a netip.Addr) netip.Addr {
	b := p.Masked().Addr().As16()
	v4 := a.Unmap().As4()
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

// CheckPrefix6 validates p as the IPv6 tunnel prefix beside the IPv4
// tunnel subnet.
func CheckPrefix6(p netip.Prefix) error {
	switch {
	case !p.IsValid():
		return fmt.Errorf("ipv6 tunnel prefix: not set")
	case !p.Addr().Is6() || p.Addr().Is4In6():
		return fmt.Errorf("ipv6 tunnel prefix %s: not an IPv6 prefix", p)
	case p.Bits() > MaxPrefix6Bits:
		return fmt.Errorf("ipv6 tunnel prefix %s: longer than /%d, no room for the embedded IPv4 address", p, MaxPrefix6Bits)
	}
	return nil
}

// SetPrefix6 makes the Manager a dual-stack one: every lease handed out or
// restored from now on carries a second address, the one of p that embeds
// its IPv4 address. It fails if p is not a valid IPv6 prefix of at most /96 or
// if the Manager's own subnet is not IPv4. Call it before the first
// Allocate or Restore.
func (m *Manager) SetPrefix6(p netip.Prefix) error {
	if err := CheckPrefix6(p); err != nil {
		return err
	}
	if !m.prefix.Addr().Is4() {
		return fmt.Errorf("ipv6 tunnel prefix %s: the tunnel subnet %s is not IPv4", p, m.prefix)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tunnels[ipfamily.V6.Index] = p.Masked()
	return nil
}

// Prefix returns the tunnel prefix of family f; invalid when the Manager
// gives jobs no address of f.
func (m *Manager) Prefix(f *ipfamily.Family) netip.Prefix {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tunnels[f.Index]
}

// GatewayAddr returns the gateway's tunnel address of family f: the one
// the Manager was made with, or the one of the IPv6 prefix that embeds
// it; invalid when the Manager gives jobs no address of f.
func (m *Manager) GatewayAddr(f *ipfamily.Family) netip.Addr {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch p := m.tunnels[f.Index]; {
	case !p.IsValid():
		return netip.Addr{}
	case p == m.prefix:
		return m.gateway
	default:
		return Embed6(p, m.gateway)
	}
}
