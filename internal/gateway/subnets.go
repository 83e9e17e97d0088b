// SPDX-License-Identifier: MIT

package gateway

// The gateway's tunnel subnets, one per address family. The IPv4 one is
// --subnet; the gateway takes its first host address. The IPv6 tunnel
// prefix is the one --subnet lists, else the one kept in the state directory
// (Subnet6File), else a random ULA /48 (RFC 4193) made at the first start
// and kept there. A job's IPv6 address embeds its IPv4 one in the last 32
// bits (internal/lease dualstack.go), so it needs no state of its own and
// survives a restart with the lease; so does the gateway's. The gateway
// hands out IPv6 addresses only where jobs' IPv6 flows have somewhere to
// leave from (egress.go, planIPv6).

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/statefile"
)

// Subnet6File, in the state directory, keeps the IPv6 tunnel prefix made
// at the first start.
const Subnet6File = "subnet6"

// Subnet6Off as the deprecated --subnet6 turns IPv6 in the tunnel off.
const Subnet6Off = "off"

// setSubnets checks Subnets (valid prefixes, at most one per family) and
// puts them in order, masked: DefaultSubnet if there is none, IPv4 first.
func (c *Config) setSubnets() error {
	if len(c.Subnets) == 0 {
		c.Subnets = []netip.Prefix{netip.MustParsePrefix(DefaultSubnet)}
	}
	var by [ipfamily.N]netip.Prefix
	for _, p := range c.Subnets {
		if !p.IsValid() || p.Addr().Is4In6() {
			return fmt.Errorf("gateway: tunnel subnet %v: want an IPv4 or IPv6 prefix", p)
		}
		f := ipfamily.Of(p.Addr())
		if by[f.Index].IsValid() {
			return fmt.Errorf("gateway: tunnel subnets %v: want at most one per family", c.Subnets)
		}
		by[f.Index] = p.Masked()
	}
	c.Subnets = nil
	for _, p := range by {
		if p.IsValid() {
			c.Subnets = append(c.Subnets, p)
		}
	}
	return nil
}

// subnet returns the tunnel subnet whose addresses the gateway allocates:
// the first of Subnets (IPv4, or IPv6 on an IPv6-only tunnel).
func (c Config) subnet() netip.Prefix {
	if len(c.Subnets) == 0 {
		return netip.MustParsePrefix(DefaultSubnet)
	}
	return c.Subnets[0]
}

// subnetOf returns the tunnel prefix of family f that Subnets lists, or
// the zero Prefix.
func (c Config) subnetOf(f *ipfamily.Family) netip.Prefix {
	for _, p := range c.Subnets {
		if f.Contains(p.Addr()) {
			return p
		}
	}
	return netip.Prefix{}
}

// egressAddrsOf returns the egress addresses of family f that
// EgressAddrs lists, unmapped.
func (c Config) egressAddrsOf(f *ipfamily.Family) []netip.Addr {
	var out []netip.Addr
	for _, a := range c.EgressAddrs {
		if f.Contains(a) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// planSubnets returns the tunnel prefixes the gateway runs with: the
// subnet it allocates in, and the IPv6 prefix beside an IPv4 one that
// planSubnet6 finds.
func planSubnets(cfg Config, log *slog.Logger) ([]netip.Prefix, error) {
	p6, err := planSubnet6(cfg, log)
	if err != nil || !p6.IsValid() {
		return []netip.Prefix{cfg.subnet()}, err
	}
	return []netip.Prefix{cfg.subnet(), p6}, nil
}

// planSubnet6 returns the IPv6 tunnel prefix beside the IPv4 one (see the
// file comment), or the zero Prefix when IPv6 is off or the tunnel is
// IPv6-only.
func planSubnet6(cfg Config, log *slog.Logger) (netip.Prefix, error) {
	if cfg.NoIPv6 || !cfg.subnet().Addr().Is4() {
		return netip.Prefix{}, nil
	}
	if p := cfg.subnetOf(ipfamily.V6); p.IsValid() {
		p = p.Masked()
		if err := lease.CheckPrefix6(p); err != nil {
			return netip.Prefix{}, fmt.Errorf("--subnet (IPv6 prefix): %w", err)
		}
		return p, nil
	}
	path := filepath.Join(cfg.StateDir, Subnet6File)
	b, err := os.ReadFile(path)
	if err == nil {
		p, err := netip.ParsePrefix(strings.TrimSpace(string(b)))
		if err == nil {
			err = lease.CheckPrefix6(p)
		}
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("ipv6 tunnel prefix in %s: %w (remove the file to make a new one)", path, err)
		}
		return p.Masked(), nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return netip.Prefix{}, fmt.Errorf("read ipv6 tunnel prefix: %w", err)
	}
	p, err := randomULA48()
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := statefile.WriteAtomic(path, []byte(p.String()+"\n"), 0o644); err != nil {
		return netip.Prefix{}, fmt.Errorf("write ipv6 tunnel prefix: %w", err)
	}
	log.Info("made the IPv6 tunnel prefix (a random unique-local /48, kept in the state dir)", "subnet6", p, "file", path)
	return p, nil
}

// randomULA48 returns fdXX:XXXX:XXXX::/48 with a random global ID (RFC
// 4193 section 3.2).
func randomULA48() (netip.Prefix, error) {
	var b [16]byte
	if _, err := rand.Read(b[1:6]); err != nil {
		return netip.Prefix{}, fmt.Errorf("random ipv6 prefix: %w", err)
	}
	b[0] = 0xfd
	return netip.PrefixFrom(netip.AddrFrom16(b), 48), nil
}

// tunnelAddrs returns the gateway's tunnel addresses with their subnets'
// lengths, one per family of the lease manager's tunnel prefixes, IPv4
// first.
func tunnelAddrs(leases *lease.Manager) []netip.Prefix {
	var out []netip.Prefix
	for _, f := range ipfamily.All {
		if p := leases.Prefix(f); p.IsValid() {
			out = append(out, netip.PrefixFrom(leases.GatewayAddr(f), p.Bits()))
		}
	}
	return out
}
