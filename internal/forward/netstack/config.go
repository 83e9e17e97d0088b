// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/usernet"
)

// Defaults for zero Config fields.
const (
	DefaultMTU            = 1420
	DefaultResolvConf     = "/etc/resolv.conf"
	DefaultDialTimeout    = 10 * time.Second
	DefaultUDPIdleTimeout = 60 * time.Second
	DefaultMaxInFlightSYN = 1024
)

// Config configures a Stack. Zero values of optional fields select the
// defaults above.
type Config struct {
	// Logger receives lifecycle (Info) and per-flow (Debug, rate-limited)
	// logs. Required.
	Logger *slog.Logger

	// Addrs are the gateway's tunnel addresses with the tunnel subnets'
	// lengths, at most one per address family, e.g. 100.64.0.1/16 and
	// fd00:a1::6440:1/48: the netstack owns them, a DNS server listens on
	// port 53 of each, and jobs' addresses are in their subnets.
	// Required: at least one.
	Addrs []netip.Prefix

	// MTU is the tunnel MTU in bytes; 0 means DefaultMTU.
	MTU int

	// DNSUpstreams are the resolvers that DNS queries to Addr:53 are
	// forwarded to, tried in order. Empty means the nameservers of
	// ResolvConf. Loopback resolvers (e.g. 127.0.0.53) are fine: the
	// gateway process itself queries them.
	DNSUpstreams []netip.AddrPort
	// DNSRoute, if set, may answer a query to Addr:53 instead of the
	// upstreams (dnsfwd.Config.Route).
	DNSRoute func(ctx context.Context, req *dns.Msg, network string) (*dns.Msg, bool, error)

	// ResolvConf is the resolv.conf read when DNSUpstreams is empty;
	// "" means DefaultResolvConf.
	ResolvConf string

	// DialTimeout bounds dialling a TCP destination; 0 means
	// DefaultDialTimeout.
	DialTimeout time.Duration

	// UDPIdleTimeout closes a UDP flow after no traffic in either
	// direction for this long; 0 means DefaultUDPIdleTimeout.
	UDPIdleTimeout time.Duration

	// MaxInFlightSYN caps TCP connection attempts being dialled at once;
	// further SYNs are dropped until one completes. 0 means
	// DefaultMaxInFlightSYN.
	MaxInFlightSYN int

	// Dial, if non-nil, replaces the host's ordinary sockets for
	// re-originating flows: it is called with network "tcp4", "tcp6",
	// "udp4" or "udp6" and the job's destination as address ("ip:port"),
	// after allowedDestination accepted it. UDP connections must be
	// connected (each Read returns one datagram from the destination).
	// nil means host sockets from the job's port block (see AddJob) and
	// EgressAddr, with DialTimeout. Tests use it to reach local
	// servers while jobs name documentation addresses.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)

	// Flows, if non-nil, is the flow table every relayed flow is
	// recorded in (flows.go).
	Flows *flows.Table

	// Jobs is the job index AddJob adds jobs' addresses to (the gateway
	// shares it with its capture taps); nil means the flow table's, or a
	// fresh one without a flow table. With a flow table it must be the
	// table's.
	Jobs *jobs.Index

	// Egress are the host addresses jobs' flows leave from, at most one
	// per family, where a job's egress entry names none (an unspecified
	// address or none for the family); a family without one leaves from
	// the kernel's choice per destination. Exposures at an unspecified
	// address listen on the family's.
	Egress []netip.Addr

	// ExplicitPorts makes jobs' sockets bind to a port of the job's block
	// themselves (trying the block's ports from a random start until one
	// is free) instead of letting the kernel pick one with
	// IP_LOCAL_PORT_RANGE. The gateway sets it when the blocks lie
	// outside net.ipv4.ip_local_port_range, where the kernel ignores a
	// socket's range.
	ExplicitPorts bool

	// ListenPing, if non-nil, replaces the host's "ping" sockets
	// (socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP), and AF_INET6 with
	// IPPROTO_ICMPV6) that relay jobs' echo requests of family f. Each
	// call opens one socket, bound to local if valid (the job's egress
	// address of f): WriteTo(msg, *net.UDPAddr) sends the echo request
	// msg to the address's IP, replacing its echo id with the socket's
	// own and filling in the checksum; ReadFrom returns one echo reply
	// message (ICMP header onwards, with the socket's id) and its sender
	// as a *net.UDPAddr, and honours read deadlines. nil means host ping
	// sockets. Tests use it where ping sockets are not allowed.
	ListenPing func(f *ipfamily.Family, local netip.Addr) (net.PacketConn, error)

	// KernelTCP, if non-nil, is a private namespace (internal/usernet)
	// whose kernel TCP terminates jobs' IPv4 TCP instead of the netstack
	// (kerneltcp_linux.go). The Stack owns it from New on, also when New
	// fails.
	KernelTCP *usernet.Namespace

	// HostAddrs lists the gateway host's own addresses, which jobs may not
	// reach. nil means the addresses of this network namespace's
	// interfaces, re-read every 10 s.
	HostAddrs func() ([]netip.Addr, error)
	// LocalRoutes lists the prefixes the host routes as local (its local
	// routing table, not counting loopback's, which the floor covers):
	// every address in them is the host's too. Nil means this network
	// namespace's local table, unless HostAddrs is set (tests).
	LocalRoutes func() ([]netip.Prefix, error)
}

// withDefaults validates c and returns a copy with defaults filled in.
func (c Config) withDefaults() (Config, error) {
	if c.Logger == nil {
		return c, errors.New("netstack config: Logger is required")
	}
	if len(c.Addrs) == 0 {
		return c, errors.New("netstack config: Addrs is required")
	}
	var seen [ipfamily.N]bool
	addrs := make([]netip.Prefix, len(c.Addrs))
	for i, p := range c.Addrs {
		f := ipfamily.Of(p.Addr())
		if !p.IsValid() || f == nil || seen[f.Index] || p.Bits() > f.Bits {
			return c, fmt.Errorf("netstack config: tunnel addresses %v: want at most one address/prefix per family", c.Addrs)
		}
		seen[f.Index] = true
		addrs[i] = netip.PrefixFrom(p.Addr().Unmap(), p.Bits())
	}
	c.Addrs = addrs
	c.Egress = append([]netip.Addr(nil), c.Egress...)
	for i, a := range c.Egress {
		f := ipfamily.Of(a)
		if f == nil || a.IsMulticast() || a.IsUnspecified() {
			return c, fmt.Errorf("netstack config: egress address %v: want a unicast address", a)
		}
		c.Egress[i] = a.Unmap()
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.MTU < 576 || c.MTU > 65535 {
		return c, fmt.Errorf("netstack config: MTU %d out of range 576..65535", c.MTU)
	}
	if c.ResolvConf == "" {
		c.ResolvConf = DefaultResolvConf
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.UDPIdleTimeout <= 0 {
		c.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if c.MaxInFlightSYN <= 0 {
		c.MaxInFlightSYN = DefaultMaxInFlightSYN
	}
	if len(c.DNSUpstreams) == 0 {
		ups, err := dnsfwd.ReadResolvConf(c.ResolvConf)
		if err != nil {
			return c, err
		}
		c.DNSUpstreams = ups
	} else {
		c.DNSUpstreams = append([]netip.AddrPort(nil), c.DNSUpstreams...)
	}
	if c.HostAddrs == nil && c.LocalRoutes == nil {
		c.LocalRoutes = localRoutes
	}
	if c.HostAddrs == nil {
		c.HostAddrs = interfaceAddrs
	}
	return c, nil
}
