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
// leave from (egress.go, planEgress6).

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

// planSubnet6 returns the IPv6 tunnel prefix (see the file comment), or
// the zero Prefix when IPv6 is off or the IPv4 subnet is not IPv4.
func planSubnet6(cfg Config, log *slog.Logger) (netip.Prefix, error) {
	if cfg.NoIPv6 || !cfg.Subnet.Addr().Is4() {
		return netip.Prefix{}, nil
	}
	if cfg.Subnet6.IsValid() {
		p := cfg.Subnet6.Masked()
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
