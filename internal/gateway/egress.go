// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
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

// egress is the gateway's egress part: the resolved egress configuration
// (mode, public addresses, port blocks), where exposures listen and how
// many jobs the gateway holds. It is read-only once Run has planned it.
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
	// publicOf is, by family (ipfamily.Family.Index), where jobs' flows
	// of a family the pool is not of leave from, with their port block:
	// the IPv6 egress address beside an IPv4 pool. own, if valid, is
	// --egress-prefix: each job's IPv6 flows leave from its own address
	// in it, with any port. Neither for IPv6: jobs get no IPv6
	// (planIPv6).
	publicOf [ipfamily.N]netip.Addr
	own      netip.Prefix
	// prefix6 is the IPv6 tunnel prefix of a dual-stack tunnel, the
	// lease manager's (applyPrefix6); zero: jobs get no IPv6 beside IPv4.
	prefix6 netip.Prefix
	// exposeAddr is the public address announced for exposures (the
	// zero Addr: none can be exposed); capacity is how many jobs the
	// gateway holds and what bounds it (capacity.go).
	exposeAddr netip.Addr
	capacity   capacity
}

// egressOf returns where the flows of lease l leave from, one entry per
// address family of its tunnel addresses: from its block's pool address
// with its block (the family of that address; the other family's flows of
// a pool of IPv6 addresses leave from the kernel's choice with the same
// block), IPv6 from the IPv6 egress address with the same block, or from
// the job's own address in --egress-prefix (the one that embeds its IPv4
// tunnel address, like its IPv6 tunnel address) with its own ports.
func (e *egress) egressOf(l lease.Lease) []forward.Egress {
	block, at := e.block(l), e.blockAddr(l)
	var out []forward.Egress
	for _, a := range l.AddrList() {
		f := ipfamily.Of(a)
		switch {
		case f.Contains(at):
			out = append(out, forward.Egress{Addr: at, Block: block})
		case f == ipfamily.V6 && e.own.IsValid():
			out = append(out, forward.Egress{Addr: lease.Embed6(e.own, l.Addr()), Own: true})
		case e.publicOf[f.Index].IsValid():
			out = append(out, forward.Egress{Addr: e.publicOf[f.Index], Block: block})
		default:
			out = append(out, forward.Egress{Addr: f.Unspecified, Block: block})
		}
	}
	return out
}

// egressEnv is what planEgress needs from the host; tests replace it.
type egressEnv struct {
	// hostRange returns net.ipv4.ip_local_port_range.
	hostRange func() (portblock.Range, error)
	// defaultSource returns the preferred source address of the default
	// route of a family.
	defaultSource func(*ipfamily.Family) (netip.Addr, error)
}

var hostEgressEnv = egressEnv{hostRange: portblock.HostEphemeralRange, defaultSource: defaultRouteSource}

// planEgress validates the egress flags and picks the defaults, for
// every family: the egress address or pool and the port blocks
// (planPublic), and where jobs' IPv6 flows of a dual-stack tunnel leave
// from (planIPv6). It is the gateway's one egress planner.
func planEgress(c Config, env egressEnv) (egress, error) {
	e, err := planPublic(c, env)
	if err != nil {
		return egress{}, err
	}
	if err := e.planIPv6(c, env.defaultSource); err != nil {
		return egress{}, err
	}
	return e, nil
}

// egressAddrs returns the configured egress pool (--egress-addr: the
// addresses of the family the gateway allocates tunnel addresses of),
// checked, and checks that there is at most one IPv6 address beside an
// IPv4 pool.
func egressAddrs(c Config) ([]netip.Addr, error) {
	fam := ipfamily.Of(c.subnet().Addr())
	if six := c.egressAddrsOf(ipfamily.V6); fam == ipfamily.V4 && len(six) > 1 {
		return nil, fmt.Errorf("--egress-addr %v: %d IPv6 addresses; want at most one (an egress pool is of IPv4 addresses)", six, len(six))
	}
	addrs := c.egressAddrsOf(fam)
	for i, a := range addrs {
		addrs[i] = a.Unmap()
		if addrs[i].IsUnspecified() || addrs[i].IsLoopback() || addrs[i].IsMulticast() {
			return nil, fmt.Errorf("--egress-addr %s: want unicast addresses of this host", a)
		}
		// A pool is of IPv4 addresses; one IPv6 address is user mode's
		// source for jobs' IPv6 flows (kernel mode checks below).
		if !addrs[i].Is4() && len(addrs) > 1 {
			return nil, fmt.Errorf("--egress-addr %s: an egress pool takes unicast IPv4 addresses of this host", a)
		}
	}
	return addrs, nil
}

// planPublic picks the egress address (or pool) and the port blocks.
func planPublic(c Config, env egressEnv) (egress, error) {
	e := egress{mode: c.Egress}
	if e.mode == "" {
		e.mode = EgressUser
	}
	size := c.BlockSize
	if size == 0 {
		size = DefaultBlockSize
	}
	addrs, err := egressAddrs(c)
	if err != nil {
		return egress{}, err
	}
	e.public, e.publicFrom = netip.Addr{}, "--egress-addr"
	if len(addrs) > 0 {
		e.public = addrs[0]
	}
	var r portblock.Range
	switch e.mode {
	case EgressUser:
		r, err = e.planUser(c.EgressPorts, env)
	case EgressKernel:
		r, err = e.planKernel(c.EgressPorts, env)
	default:
		err = fmt.Errorf("--egress %q: want %s or %s", c.Egress, EgressUser, EgressKernel)
	}
	if err != nil {
		return egress{}, err
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

// planUser picks user mode's port range (r, else the host's ephemeral
// range) and, without --egress-addr, the default route's source (none:
// the unspecified address, flows leave from the kernel's choice).
func (e *egress) planUser(r portblock.Range, env egressEnv) (portblock.Range, error) {
	host, err := env.hostRange()
	if err != nil {
		return r, fmt.Errorf("user-mode egress: %w", err)
	}
	if r == (portblock.Range{}) {
		r = host
	} else if r.Lo < host.Lo || r.Hi > host.Hi {
		// The kernel ignores a socket's IP_LOCAL_PORT_RANGE outside
		// the host's range: bind explicitly (portblock.Dialer).
		e.explicit = true
	}
	if !e.public.IsValid() {
		a, err := env.defaultSource(ipfamily.V4)
		if err != nil {
			e.public, e.publicFrom, e.publicErr = netip.IPv4Unspecified(), "", err
		} else {
			e.public, e.publicFrom = a, "default route"
		}
	}
	if e.publicFrom != "" && (e.public.IsUnspecified() || e.public.IsLoopback() || e.public.IsMulticast()) {
		return r, fmt.Errorf("--egress-addr %s: want a unicast address of this host", e.public)
	}
	return r, nil
}

// planKernel picks kernel mode's port range (r, else DefaultKernelPorts)
// and, without --egress-addr, the default route's source, which it
// needs: an IPv4 address to source-NAT to.
func (e *egress) planKernel(r portblock.Range, env egressEnv) (portblock.Range, error) {
	if r == (portblock.Range{}) {
		r = DefaultKernelPorts
	}
	if !e.public.IsValid() {
		a, err := env.defaultSource(ipfamily.V4)
		if err != nil {
			return r, fmt.Errorf("kernel egress needs the public address to source-NAT to: set --egress-addr (%w)", err)
		}
		e.public, e.publicFrom = a, "default route"
	}
	if !e.public.Is4() || e.public.IsUnspecified() || e.public.IsLoopback() || e.public.IsMulticast() {
		return r, fmt.Errorf("--egress-addr %s: kernel egress needs a unicast IPv4 address of this host", e.public)
	}
	return r, nil
}

// routeProbe is, per family, an outside destination whose route stands for
// the default route's where the route names no gateway.
var routeProbe = [ipfamily.N]net.IP{net.IPv4(192, 0, 2, 1), net.ParseIP("2001:4860:4860::8888")}

// defaultRouteSource returns the preferred source address of the host's
// default route of family f: its prefsrc, else the source the kernel picks
// towards its gateway (IPv4) or an outside destination. An IPv6 link-local
// source is no public address.
func defaultRouteSource(f *ipfamily.Family) (netip.Addr, error) {
	routes, err := netlink.RouteList(nil, []int{netlink.FAMILY_V4, netlink.FAMILY_V6}[f.Index])
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list routes: %w", err)
	}
	usable := func(b net.IP) (netip.Addr, bool) {
		a, ok := netip.AddrFromSlice(b)
		a = a.Unmap()
		return a, ok && f.Contains(a) && !a.IsUnspecified() && !a.IsLinkLocalUnicast()
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if a, ok := usable(r.Src); ok {
			return a, nil
		}
		// No prefsrc on the route: ask the kernel which source it picks.
		dst := routeProbe[f.Index]
		if f == ipfamily.V4 && r.Gw != nil {
			dst = r.Gw
		}
		got, err := netlink.RouteGet(dst)
		if err == nil && len(got) > 0 {
			if a, ok := usable(got[0].Src); ok {
				return a, nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("this host has no %s default route with a global source address", f)
}

// EgressSource returns the address a user-mode gateway's jobs' flows of
// family f leave from without --egress-addr or --egress-addr: the source
// of the host's default route of that family.
func EgressSource(f *ipfamily.Family) (netip.Addr, error) { return defaultRouteSource(f) }

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

// planIPv6 finds where jobs' IPv6 flows of a dual-stack tunnel leave
// from (--egress-prefix, else the IPv6 --egress-addr, else the source of
// the host's IPv6 default route, source) and, if they have somewhere to,
// sets e.prefix6 to the tunnel's IPv6 prefix (applyPrefix6 makes the
// lease manager dual-stack with it). Without the IPv6 tunnel prefix (IPv6
// off, or an IPv6-only tunnel) it does nothing.
func (e *egress) planIPv6(cfg Config, source func(*ipfamily.Family) (netip.Addr, error)) error {
	log := cfg.Logger
	subnet6 := cfg.subnetOf(ipfamily.V6)
	if !cfg.subnet().Addr().Is4() || !subnet6.IsValid() {
		return nil
	}
	six := cfg.egressAddrsOf(ipfamily.V6)
	switch {
	case cfg.EgressPrefix6.IsValid():
		if err := checkEgressPrefix6(cfg.EgressPrefix6, cfg.subnet()); err != nil {
			return err
		}
		e.own = cfg.EgressPrefix6.Masked()
		if cfg.Egress != EgressKernel {
			if err := checkOwnPrefix6(log, e.own, lease.Embed6(e.own, cfg.subnet().Addr().Next())); err != nil {
				return err
			}
		}
	case len(six) > 0:
		a := six[0]
		if a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() {
			return fmt.Errorf("--egress-addr %s: want a global unicast IPv6 address of this host", a)
		}
		if !isHostAddr(a) {
			return fmt.Errorf("--egress-addr %s is not an address of this host: user mode opens jobs' IPv6 sockets and exposed ports on it", a)
		}
		e.publicOf[ipfamily.V6.Index] = a
	default:
		a, err := source(ipfamily.V6)
		if err != nil {
			// IPv6 addresses would only make jobs try IPv6 first for
			// dual-stack names, and fail.
			log.Warn("jobs get IPv4 only: this host has no IPv6 default route with a source address; set --egress-addr (or --egress-prefix) to give them IPv6", "err", err)
			return nil
		}
		e.publicOf[ipfamily.V6.Index] = a
	}
	e.prefix6 = subnet6.Masked()
	return nil
}

// applyPrefix6 makes leases dual-stack if the plan has IPv6 beside IPv4:
// its leases then carry IPv6 addresses in the IPv6 tunnel prefix.
func (e egress) applyPrefix6(log *slog.Logger, leases *lease.Manager) error {
	if !e.prefix6.IsValid() {
		return nil
	}
	if err := leases.SetPrefix6(e.prefix6); err != nil {
		return err
	}
	log.Info("IPv6 in the tunnel", "subnet6", e.prefix6, "tunnel_addr6", leases.GatewayAddr(ipfamily.V6), "egress_addr6", e.publicOf[ipfamily.V6.Index], "egress_prefix6", e.own)
	return nil
}

// checkEgressPrefix6 validates --egress-prefix: an IPv6 prefix of at
// most /96, so that every IPv4 tunnel address of subnet has its own
// address in it.
func checkEgressPrefix6(p, subnet netip.Prefix) error {
	if err := lease.CheckPrefix6(p); err != nil {
		return fmt.Errorf("--egress-prefix: %w", err)
	}
	a := p.Addr()
	if a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() {
		return fmt.Errorf("--egress-prefix %s: want a routed unicast prefix", p)
	}
	return nil
}

// checkOwnPrefix6 checks, for user mode, the admin's one-time setup for
// --egress-prefix (CheckLocalPrefix6); the gateway does not start
// without it.
func checkOwnPrefix6(log *slog.Logger, p netip.Prefix, probe netip.Addr) error {
	if err := CheckLocalPrefix6(p, probe); err != nil {
		return fmt.Errorf("--egress-prefix %s: %w", p, err)
	}
	log.Info("--egress-prefix: the prefix is a local route; jobs' IPv6 flows leave from their own addresses", "prefix", p)
	return nil
}

// CheckLocalPrefix6 checks that p, a user-mode gateway's --egress-prefix,
// is a local route of this host (probing its address probe; the zero
// Addr means the prefix's first address): jobs' sockets bind to
// addresses of the prefix that no interface has (IPV6_FREEBIND, no
// privilege needed), and the host accepts the replies the site routes to
// it only through such a route. The error says the fix.
func CheckLocalPrefix6(p netip.Prefix, probe netip.Addr) error {
	if !probe.IsValid() {
		probe = p.Masked().Addr().Next()
	}
	routes, err := netlink.RouteGet(probe.AsSlice())
	if err != nil || len(routes) == 0 || routes[0].Type != unix.RTN_LOCAL {
		return fmt.Errorf("the prefix is not a local route of this host, so replies to jobs' own addresses would not reach them; as root, once: ip -6 route add local %s dev lo (and have the site route %s to this host)", p.Masked(), p.Masked())
	}
	return nil
}

// block returns the port range of l's block, or the zero Range if it has
// none.
func (e *egress) block(l lease.Lease) portblock.Range {
	if l.Block < 0 || l.Block >= e.pool.Blocks() {
		return portblock.Range{}
	}
	_, r := e.pool.Run(l.Block, l.Blocks)
	return r
}

// blockAddr returns the public address of l's block: the address of the
// egress pool its flows leave from, or, without a block, the first.
func (e *egress) blockAddr(l lease.Lease) netip.Addr {
	if l.Block < 0 || l.Block >= e.pool.Blocks() {
		return e.public
	}
	a, _ := e.pool.Block(l.Block)
	return a
}

// planExposures checks a join's --expose request and picks the public
// ports, from the top of the job's block, and plans them on each of the
// job's egress addresses: the same public port at a shared address, the
// job's own port at its own address (--egress-prefix). This is the one
// place that decides where a job's exposures listen; the backends and
// the lease follow it.
func (e *egress) planExposures(l lease.Lease, egress []forward.Egress, reqs []control.Port) ([]forward.Exposure, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	at := e.blockAddr(l)
	if !e.exposeAddr.IsValid() || !at.IsValid() || at.IsUnspecified() {
		return nil, fmt.Errorf("%w: this gateway's egress backend cannot expose ports", errNoExposure)
	}
	ports, err := allocExposures(e.block(l), reqs)
	if err != nil {
		return nil, err
	}
	var out []forward.Exposure
	for _, eg := range egress {
		if !eg.Addr.IsValid() || eg.Addr.IsUnspecified() {
			continue // nowhere announced to listen
		}
		for _, x := range ports {
			x.PublicAddr = eg.Addr
			if eg.Own {
				// The job's own address: its own port, no translation.
				x.PublicPort = x.JobPort
			}
			out = append(out, x)
		}
	}
	return out, nil
}

// checkRestored checks that restored lease l of record r (a lease of the
// previous run) has port blocks this run's plan has, at the address and
// ports the record attributed to it: a changed --egress-addr,
// --egress-ports or --block-size moves them.
func (e *egress) checkRestored(l lease.Lease, r store.LeaseRecord) error {
	if l.Block < 0 {
		return nil
	}
	if l.Block+(l.Blocks-1)*len(e.pool.Addrs) >= e.pool.Blocks() {
		return fmt.Errorf("port blocks %d (%d of them) are past the %d blocks of the plan now (--egress-addr, --egress-ports or --block-size changed)", l.Block, l.Blocks, e.pool.Blocks())
	}
	block, pubAddr := e.block(l), e.blockAddr(l)
	for _, a := range store.Attributions(r) {
		if a.Own {
			continue
		}
		if a.PortLo != block.Lo || a.PortHi != block.Hi || ipfamily.Of(a.Addr) == ipfamily.Of(pubAddr) && a.Addr != pubAddr {
			return fmt.Errorf("port block %d is now %v:%v, was %v:%d-%d (--egress-addr, --egress-ports or --block-size changed)", l.Block, pubAddr, block, a.Addr, a.PortLo, a.PortHi)
		}
	}
	return nil
}
