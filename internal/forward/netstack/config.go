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

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/flows"
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

	// Addr is the gateway's tunnel address with the tunnel subnet length,
	// e.g. 100.64.0.1/16. The DNS server listens on Addr port 53. Required.
	Addr netip.Prefix

	// Addr6, if valid, is the gateway's IPv6 tunnel address with the IPv6
	// tunnel prefix length (dualstack.go): the netstack owns it too, and a
	// second DNS server listens on Addr6 port 53.
	Addr6 netip.Prefix

	// MTU is the tunnel MTU in bytes; 0 means DefaultMTU.
	MTU int

	// DNSUpstreams are the resolvers that DNS queries to Addr:53 are
	// forwarded to, tried in order. Empty means the nameservers of
	// ResolvConf. Loopback resolvers (e.g. 127.0.0.53) are fine: the
	// gateway process itself queries them.
	DNSUpstreams []netip.AddrPort

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

	// EgressAddr, if valid, is the host address jobs' flows leave from;
	// invalid means the kernel's choice per destination.
	EgressAddr netip.Addr

	// ExplicitPorts makes jobs' sockets bind to a port of the job's block
	// themselves (trying the block's ports from a random start until one
	// is free) instead of letting the kernel pick one with
	// IP_LOCAL_PORT_RANGE. The gateway sets it when the blocks lie
	// outside net.ipv4.ip_local_port_range, where the kernel ignores a
	// socket's range.
	ExplicitPorts bool

	// ListenPing, if non-nil, replaces the host's ICMPv4 "ping" sockets
	// (socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)) that relay jobs' echo
	// requests. Each call opens one socket: WriteTo(msg, *net.UDPAddr)
	// sends the ICMP echo request msg to the address's IP, replacing its
	// echo id with the socket's own and filling in the checksum; ReadFrom
	// returns one ICMP echo reply message (ICMP header onwards, with the
	// socket's id) and its sender as a *net.UDPAddr, and honours read
	// deadlines. nil means host ping sockets bound to EgressAddr. Tests use
	// it where ping sockets are not allowed.
	ListenPing func() (net.PacketConn, error)

	// ListenPing6 is ListenPing for ICMPv6 echo (socket(AF_INET6,
	// SOCK_DGRAM, IPPROTO_ICMPV6)); addresses are IPv6. nil means host
	// ICMPv6 ping sockets bound to EgressAddr if it is IPv6, else to ::.
	ListenPing6 func() (net.PacketConn, error)

	// KernelTCP, if non-nil, is a private namespace (internal/usernet)
	// whose kernel TCP terminates jobs' IPv4 TCP instead of the netstack
	// (kerneltcp_linux.go). The Stack owns it from New on, also when New
	// fails.
	KernelTCP *usernet.Namespace

	// HostAddrs lists the gateway host's own addresses, which jobs may not
	// reach. nil means the addresses of this network namespace's
	// interfaces, re-read every 10 s.
	HostAddrs func() ([]netip.Addr, error)
}

// withDefaults validates c and returns a copy with defaults filled in.
func (c Config) withDefaults() (Config, error) {
	if c.Logger == nil {
		return c, errors.New("netstack config: Logger is required")
	}
	if !c.Addr.IsValid() {
		return c, errors.New("netstack config: Addr is required")
	}
	c.Addr = netip.PrefixFrom(c.Addr.Addr().Unmap(), c.Addr.Bits())
	if c.Addr.Addr().Is4() && c.Addr.Bits() > 32 {
		return c, fmt.Errorf("netstack config: Addr %s: prefix length too long", c.Addr)
	}
	if c.Addr6.IsValid() && (!c.Addr6.Addr().Is6() || c.Addr6.Addr().Is4In6() || !c.Addr.Addr().Is4()) {
		return c, fmt.Errorf("netstack config: Addr6 %s: want an IPv6 address beside an IPv4 Addr", c.Addr6)
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
	if c.HostAddrs == nil {
		c.HostAddrs = interfaceAddrs
	}
	return c, nil
}
