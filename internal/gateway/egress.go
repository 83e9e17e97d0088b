// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Egress modes (Config.Egress).
const (
	// EgressUser re-originates jobs' flows as the gateway's own sockets
	// (gVisor netstack); needs no privileges.
	EgressUser = "user"
	// EgressKernel forwards jobs' packets through a kernel TUN with
	// nftables SNAT; needs root or CAP_NET_ADMIN.
	EgressKernel = "kernel"
)

// DefaultBlockSize is the number of ports per job.
const DefaultBlockSize = 256

// DefaultKernelPorts is kernel mode's default egress range: 40000 ports
// (156 blocks of 256), clear of the well-known and registered ports most
// services listen on, and of the top of the host's usual ephemeral range.
// SNAT keeps the mappings unique through conntrack, so it may overlap the
// host's own ephemeral range.
var DefaultKernelPorts = portblock.Range{Lo: 20000, Hi: 59999}

// egress is the resolved egress configuration.
type egress struct {
	mode string
	// public is the address jobs' flows leave from and their exposed
	// ports listen on: --egress-addr, else the preferred source of the
	// host's default route. Only in user mode on a host without a default
	// route is it the unspecified address: flows then leave from the
	// kernel's choice per destination and jobs cannot expose ports.
	public netip.Addr
	// publicFrom says where public came from (for the start-up log):
	// "--egress-addr" or "default route"; publicErr why there is none.
	publicFrom string
	publicErr  error
	plan       portblock.Plan
	// pool is the egress pool: plan on every public address (public
	// first); without a public address (user mode, no default route) one
	// unspecified address.
	pool portblock.Pool
	// explicit means the blocks lie outside the host's ephemeral range
	// (user mode): sockets bind to their port themselves.
	explicit bool
}

// egressEnv is what planEgress needs from the host; tests replace it.
type egressEnv struct {
	// hostRange returns net.ipv4.ip_local_port_range.
	hostRange func() (portblock.Range, error)
	// defaultSource returns the preferred source address of the default
	// route.
	defaultSource func() (netip.Addr, error)
}

var hostEgressEnv = egressEnv{hostRange: portblock.HostEphemeralRange, defaultSource: defaultRouteSource}

// planEgress validates the egress flags and picks the defaults.
func planEgress(c Config, env egressEnv) (egress, error) {
	e := egress{mode: c.Egress}
	if e.mode == "" {
		e.mode = EgressUser
	}
	size := c.BlockSize
	if size == 0 {
		size = DefaultBlockSize
	}
	r := c.EgressPorts
	addrs := c.EgressAddrs
	if len(addrs) == 0 && c.EgressAddr.IsValid() {
		addrs = []netip.Addr{c.EgressAddr}
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap()
		if addrs[i].IsUnspecified() || addrs[i].IsLoopback() || addrs[i].IsMulticast() {
			return egress{}, fmt.Errorf("--egress-addr %s: want unicast addresses of this host", a)
		}
		// A pool is of IPv4 addresses; one IPv6 address is user mode's
		// source for jobs' IPv6 flows (kernel mode checks below).
		if !addrs[i].Is4() && len(addrs) > 1 {
			return egress{}, fmt.Errorf("--egress-addr %s: an egress pool takes unicast IPv4 addresses of this host", a)
		}
	}
	switch e.mode {
	case EgressUser:
		host, err := env.hostRange()
		if err != nil {
			return egress{}, fmt.Errorf("user-mode egress: %w", err)
		}
		if r == (portblock.Range{}) {
			r = host
		} else if r.Lo < host.Lo || r.Hi > host.Hi {
			// The kernel ignores a socket's IP_LOCAL_PORT_RANGE outside
			// the host's range: bind explicitly (portblock.Dialer).
			e.explicit = true
		}
		e.public, e.publicFrom = netip.Addr{}, "--egress-addr"
		if len(addrs) > 0 {
			e.public = addrs[0]
		}
		if !e.public.IsValid() {
			a, err := env.defaultSource()
			if err != nil {
				e.public, e.publicFrom, e.publicErr = netip.IPv4Unspecified(), "", err
			} else {
				e.public, e.publicFrom = a, "default route"
			}
		}
		if e.publicFrom != "" && (e.public.IsUnspecified() || e.public.IsLoopback() || e.public.IsMulticast()) {
			return egress{}, fmt.Errorf("--egress-addr %s: want a unicast address of this host", e.public)
		}
	case EgressKernel:
		if r == (portblock.Range{}) {
			r = DefaultKernelPorts
		}
		e.public, e.publicFrom = netip.Addr{}, "--egress-addr"
		if len(addrs) > 0 {
			e.public = addrs[0]
		}
		if !e.public.IsValid() {
			a, err := env.defaultSource()
			if err != nil {
				return egress{}, fmt.Errorf("kernel egress needs the public address to source-NAT to: set --egress-addr (%w)", err)
			}
			e.public, e.publicFrom = a, "default route"
		}
		if !e.public.Is4() || e.public.IsUnspecified() || e.public.IsLoopback() || e.public.IsMulticast() {
			return egress{}, fmt.Errorf("--egress-addr %s: kernel egress needs a unicast IPv4 address of this host", e.public)
		}
	default:
		return egress{}, fmt.Errorf("--egress %q: want %s or %s", c.Egress, EgressUser, EgressKernel)
	}
	plan, err := portblock.NewPlan(r, size)
	if err != nil {
		return egress{}, fmt.Errorf("--block-size: %w", err)
	}
	e.plan = plan
	if len(addrs) == 0 {
		addrs = []netip.Addr{e.public}
	}
	e.pool = portblock.Pool{Addrs: addrs, Plan: plan}
	return e, nil
}

// defaultRouteSource returns the preferred source address of the host's
// IPv4 default route.
func defaultRouteSource() (netip.Addr, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if a, ok := netip.AddrFromSlice(r.Src); ok && a.Unmap().IsValid() && !a.IsUnspecified() {
			return a.Unmap(), nil
		}
		// No prefsrc on the route: ask the kernel which source it picks.
		dst := r.Gw
		if dst == nil {
			dst = net.IPv4(192, 0, 2, 1)
		}
		got, err := netlink.RouteGet(dst)
		if err == nil && len(got) > 0 {
			if a, ok := netip.AddrFromSlice(got[0].Src); ok && !a.Unmap().IsUnspecified() {
				return a.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, errors.New("this host has no IPv4 default route with a source address")
}

// isHostAddr reports whether a is configured on one of the host's
// interfaces.
func isHostAddr(a netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return true // cannot tell; do not warn
	}
	for _, ia := range addrs {
		if n, ok := ia.(*net.IPNet); ok {
			if b, ok := netip.AddrFromSlice(n.IP); ok && b.Unmap() == a {
				return true
			}
		}
	}
	return false
}

// logPublic logs the egress address at start: where it came from, or why
// there is none and what that costs.
func (e egress) logPublic(log *slog.Logger) {
	if e.explicit {
		log.Warn("--egress-ports lies outside this host's ephemeral range (net.ipv4.ip_local_port_range): jobs' sockets bind to a port of their block "+
			"themselves, which costs a few bind attempts per connection as a block fills (docs/benchmarks.md, \"Scale\"); widen the sysctl to avoid it",
			"egress_ports", e.plan.Range)
	}
	if e.publicFrom != "" {
		log.Info("egress address: jobs' flows leave from it and their exposed ports listen on it",
			"egress_addr", e.public, "from", e.publicFrom, "pool", len(e.pool.Addrs), "blocks", e.pool.Blocks())
		return
	}
	log.Warn("no egress address: this host has no IPv4 default route with a source address; jobs' flows leave from the kernel's choice "+
		"per destination, whois cannot name the address, and jobs cannot expose ports; set --egress-addr", "err", e.publicErr)
}
