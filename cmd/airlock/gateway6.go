// SPDX-License-Identifier: MIT

package main

import (
	"fmt"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/gateway"
)

// ipv6Flags are the gateway's IPv6 flags (internal/gateway dualstack.go).
type ipv6Flags struct {
	subnet6, egressAddr6, egressPrefix6 string
}

func addIPv6Flags(fs *pflag.FlagSet) *ipv6Flags {
	f := &ipv6Flags{}
	fs.StringVar(&f.subnet6, "subnet6", "", "IPv6 tunnel prefix, at most /96; each job's IPv6 address embeds its IPv4 one in the last 32 bits, the gateway's is the one embedding its IPv4 tunnel address (default: a random unique-local /48 made at first start and kept in the state dir; \""+gateway.Subnet6Off+"\": IPv4 only)")
	fs.StringVar(&f.egressAddr6, "egress-addr6", "", "IPv6 address jobs' IPv6 connections leave from (with their port block) and exposed ports listen on (default: the source address of the IPv6 default route)")
	fs.StringVar(&f.egressPrefix6, "egress-prefix6", "", "a routed IPv6 prefix (at most /96) that gives each job its own public IPv6 address (embedding its IPv4 tunnel address): its IPv6 flows leave from it with any port; user mode needs the prefix routed to this host and a local route (ip -6 route add local PREFIX dev lo), kernel mode routes it")
	return f
}

func (f *ipv6Flags) parse(cfg *gateway.Config) error {
	var err error
	switch f.subnet6 {
	case "":
	case gateway.Subnet6Off:
		cfg.NoIPv6 = true
	default:
		if cfg.Subnet6, err = netip.ParsePrefix(f.subnet6); err != nil {
			return fmt.Errorf("bad --subnet6: %w", err)
		}
	}
	if f.egressAddr6 != "" {
		if cfg.EgressAddr6, err = netip.ParseAddr(f.egressAddr6); err != nil {
			return fmt.Errorf("bad --egress-addr6: %w", err)
		}
		if !cfg.EgressAddr6.Is6() || cfg.EgressAddr6.Is4In6() {
			return fmt.Errorf("bad --egress-addr6 %s: want an IPv6 address", f.egressAddr6)
		}
	}
	if f.egressPrefix6 != "" {
		if cfg.EgressPrefix6, err = netip.ParsePrefix(f.egressPrefix6); err != nil {
			return fmt.Errorf("bad --egress-prefix6: %w", err)
		}
		if !cfg.EgressPrefix6.Addr().Is6() || cfg.EgressPrefix6.Addr().Is4In6() || cfg.EgressPrefix6.Bits() > 96 {
			return fmt.Errorf("bad --egress-prefix6 %s: want an IPv6 prefix of at most /96", f.egressPrefix6)
		}
		if cfg.EgressPrefix6 != cfg.EgressPrefix6.Masked() {
			return fmt.Errorf("bad --egress-prefix6 %s: want the prefix %s", f.egressPrefix6, cfg.EgressPrefix6.Masked())
		}
	}
	return nil
}
