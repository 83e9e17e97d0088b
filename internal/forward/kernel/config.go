// SPDX-License-Identifier: MIT

package kernel

import (
	"log/slog"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/flows"
)

// DefaultName is the TUN's name when Config.Name is empty.
const DefaultName = "airlock0"

// Config configures a Forwarder.
type Config struct {
	// Logger receives lifecycle logs. Required.
	Logger *slog.Logger
	// Name is the TUN interface name; "" means DefaultName.
	Name string
	// Addr is the gateway's tunnel address with the tunnel subnet's length,
	// e.g. 100.64.0.1/16. Required, IPv4.
	Addr netip.Prefix
	// MTU of the TUN; 0 means DefaultMTU.
	MTU int
	// DNSUpstreams are the resolvers that jobs' queries to Addr:53 are
	// relayed to; empty means the nameservers of /etc/resolv.conf.
	DNSUpstreams []netip.AddrPort
	// EgressAddr is the public IPv4 address jobs' traffic is source-NATed
	// to. Required.
	EgressAddr netip.Addr
	// BlockSize is the number of ports of every job's block. A job's new
	// flow to a destination that already has this many of its flows is
	// refused at once (TCP reset, ICMP unreachable), since SNAT would have
	// no port for it. 0 means no limit.
	BlockSize int
	// Flows, if non-nil, is the flow table that jobs' flows are recorded
	// in, from conntrack (flows_linux.go).
	Flows *flows.Table
	// Addr6 is the gateway's IPv6 tunnel address with the IPv6 tunnel
	// subnet's length, e.g. fd00:a1::1/64; the zero Prefix means jobs
	// get no IPv6 (v6_linux.go).
	Addr6 netip.Prefix
	// EgressAddr6 is the public IPv6 address jobs' IPv6 traffic is
	// source-NATed to when a job's Egress6 names none; the zero Addr means the
	// outgoing interface's address (masquerade). Used only with Addr6.
	EgressAddr6 netip.Addr
	// EgressPrefix6 is the prefix the site routes to the gateway host
	// (--egress-prefix6): New routes it to the TUN, and AddJob maps a
	// job to its own address in it one to one. The zero Prefix means
	// none.
	EgressPrefix6 netip.Prefix
}
