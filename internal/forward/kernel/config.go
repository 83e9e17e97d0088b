// SPDX-License-Identifier: MIT

package kernel

import (
	"log/slog"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// DefaultName is the TUN's name when Config.Name is empty.
const DefaultName = "airlock0"

// Config configures a Forwarder.
type Config struct {
	// Logger receives lifecycle logs. Required.
	Logger *slog.Logger
	// Name is the TUN interface name; "" means DefaultName.
	Name string
	// Addrs are the gateway's tunnel addresses with their subnets'
	// lengths, at most one per family, e.g. 100.64.0.1/16 and
	// fd00:a1::1/64: the TUN gets them, a DNS relay listens on port 53 of
	// each, and jobs' addresses are in their subnets. The IPv4 one is
	// required; without an IPv6 one jobs get no IPv6 (embed_linux.go).
	Addrs []netip.Prefix
	// MTU of the TUN; 0 means DefaultMTU.
	MTU int
	// Queues is how many queues the TUN has (IFF_MULTI_QUEUE, one reader
	// each: internal/mqtun); 0 and 1 mean one, a TUN without
	// IFF_MULTI_QUEUE, at most mqtun.MaxQueues.
	Queues int
	// DNSUpstreams are the resolvers that jobs' queries to the tunnel
	// addresses' port 53 are relayed to; empty means the nameservers of
	// /etc/resolv.conf.
	DNSUpstreams []netip.AddrPort
	// Egress are the public addresses jobs' traffic is source-NATed to
	// where a job's egress entry of the family names none, at most one per
	// family. The IPv4 one is required; without an IPv6 one, jobs' IPv6
	// is masqueraded (the outgoing interface's address).
	Egress []netip.Addr
	// OwnPrefix is the IPv6 prefix the site routes to the gateway host
	// (--egress-prefix): New routes it to the TUN, and AddJob maps a job
	// whose IPv6 egress entry is an own address in it one to one. The
	// zero Prefix means none.
	OwnPrefix netip.Prefix
	// BlockSize is the number of ports of every job's block. A job's new
	// flow to a destination that already has this many of its flows is
	// refused at once (TCP reset, ICMP unreachable), since SNAT would have
	// no port for it. 0 means no limit.
	BlockSize int
	// Flows, if non-nil, is the flow table that jobs' flows are recorded
	// in, from conntrack (flows_linux.go).
	Flows *flows.Table
	// Jobs is the job index AddJob adds jobs' addresses to; nil means the
	// flow table's, or a fresh one without a flow table. With a flow table
	// it must be the table's.
	Jobs *jobs.Index
}
