// SPDX-License-Identifier: MIT

package gateway

// Dual stack: jobs' IPv6 tunnel addresses, the gateway's IPv6 tunnel
// address and where jobs' IPv6 flows leave from.
//
// The IPv6 tunnel prefix is --subnet6, else the one kept in the state
// directory (Subnet6File), else a random ULA /48 (RFC 4193) made at the
// first start and kept there. A job's IPv6 address embeds its IPv4 one in
// the last 32 bits (internal/lease dualstack.go), so it needs no state of
// its own and survives a restart with the lease. The gateway hands out
// IPv6 addresses only when the egress backend carries IPv6.
//
// Jobs' IPv6 flows leave from --egress-addr6, else the source address the
// host picks for its IPv6 default route, with the job's port block; or,
// with --egress-prefix6, from the job's own address in that prefix, with
// any port (egressprefix6.go).

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
)

// Subnet6File, in the state directory, keeps the IPv6 tunnel prefix made
// at the first start.
const Subnet6File = "subnet6"

// Subnet6Off as --subnet6 turns IPv6 in the tunnel off.
const Subnet6Off = "off"

// dualState is the gateway's IPv6 side; its zero value means IPv4 only.
type dualState struct {
	// prefix is the IPv6 tunnel prefix (zero: IPv4 only), gw its gateway
	// address.
	prefix netip.Prefix
	gw     netip.Addr
	// egress is where jobs' IPv6 flows leave from (with their port
	// block); invalid: the kernel's choice per destination, no exposure.
	egress netip.Addr
	// own, if valid, is --egress-prefix6: each job's IPv6 flows leave
	// from its own address in it (egressprefix6.go).
	own netip.Prefix
}

// on reports whether jobs get IPv6 addresses.
func (d dualState) on() bool { return d.prefix.IsValid() }

// planSubnet6 returns the IPv6 tunnel prefix (see the file comment), or
// the zero Prefix when IPv6 is off or the IPv4 subnet is not IPv4.
func planSubnet6(cfg Config, log *slog.Logger) (netip.Prefix, error) {
	if cfg.NoIPv6 || !cfg.Subnet.Addr().Is4() {
		return netip.Prefix{}, nil
	}
	if cfg.Subnet6.IsValid() {
		p := cfg.Subnet6.Masked()
		if err := lease.CheckPrefix6(p); err != nil {
			return netip.Prefix{}, fmt.Errorf("--subnet6: %w", err)
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
	if err := store.WriteFileAtomic(path, []byte(p.String()+"\n"), 0o644); err != nil {
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

// tunnel6 returns the gateway's IPv6 tunnel address with the prefix
// length, or the zero Prefix without IPv6.
func tunnel6(cfg Config, gwAddr netip.Addr) netip.Prefix {
	if !cfg.Subnet6.IsValid() {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(lease.Embed6(cfg.Subnet6, gwAddr), cfg.Subnet6.Bits())
}

// setupDualStack turns IPv6 on in the lease manager (both egress backends
// carry IPv6), and finds where jobs' IPv6 flows leave from.
func setupDualStack(cfg Config, leases *lease.Manager, source6 func() (netip.Addr, error)) (dualState, error) {
	log := cfg.Logger
	if !cfg.Subnet6.IsValid() {
		return dualState{}, nil
	}
	d := dualState{prefix: cfg.Subnet6}
	switch {
	case cfg.EgressPrefix6.IsValid():
		if err := checkEgressPrefix6(cfg.EgressPrefix6, cfg.Subnet); err != nil {
			return dualState{}, err
		}
		d.own = cfg.EgressPrefix6.Masked()
		if cfg.Egress != EgressKernel {
			if err := checkOwnPrefix6(log, d.own, lease.Embed6(d.own, cfg.Subnet.Addr().Next())); err != nil {
				return dualState{}, err
			}
		}
	case cfg.EgressAddr6.IsValid():
		a := cfg.EgressAddr6.Unmap()
		if !a.Is6() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() {
			return dualState{}, fmt.Errorf("--egress-addr6 %s: want a global unicast IPv6 address of this host", cfg.EgressAddr6)
		}
		if !isHostAddr(a) {
			return dualState{}, fmt.Errorf("--egress-addr6 %s is not an address of this host: user mode opens jobs' IPv6 sockets and exposed ports on it", a)
		}
		d.egress = a
	default:
		a, err := source6()
		if err != nil {
			// IPv6 addresses would only make jobs try IPv6 first for
			// dual-stack names, and fail.
			log.Warn("jobs get IPv4 only: this host has no IPv6 default route with a source address; set --egress-addr6 (or --egress-prefix6) to give them IPv6", "err", err)
			return dualState{}, nil
		}
		d.egress = a
	}
	if err := leases.SetPrefix6(cfg.Subnet6); err != nil {
		return dualState{}, err
	}
	d.gw = leases.Gateway6()
	log.Info("IPv6 in the tunnel", "subnet6", d.prefix, "tunnel_addr6", d.gw, "egress_addr6", d.egress, "egress_prefix6", d.own)
	return d, nil
}

// defaultRouteSource6 returns the source address the host picks for an
// outside IPv6 destination: a connected UDP socket sends nothing, but the
// kernel resolves the route and the source address.
func defaultRouteSource6() (netip.Addr, error) {
	c, err := net.DialUDP("udp6", nil, &net.UDPAddr{IP: net.ParseIP("2001:4860:4860::8888"), Port: 53})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("this host has no IPv6 default route: %w", err)
	}
	defer c.Close()
	a := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	if !a.Is6() || a.IsUnspecified() || a.IsLinkLocalUnicast() {
		return netip.Addr{}, fmt.Errorf("this host's IPv6 default route has no global source address (got %s)", a)
	}
	return a, nil
}

// job6 fills in the IPv6 side of j, the egress backend's view of l's job:
// its IPv6 tunnel address, where its IPv6 flows leave from and with which
// ports, and the IPv6 listeners of its exposures.
func (g *gateway) job6(j *forward.Job, l lease.Lease) {
	if !g.v6.on() || !l.Addr6.IsValid() {
		return
	}
	j.Addr6, j.Egress6, j.Block6 = l.Addr6, g.v6.egress, j.Block
	if g.v6.own.IsValid() {
		j.Egress6, j.Block6 = g.ownAddr6(l), portblock.Range{}
	}
	j.Exposures = g.expose6(l, j.Exposures)
}

// removeJob6 forgets the IPv6 side of l's job where removeJob does not
// (the backend and the flow table drop it with the IPv4 side).
func (g *gateway) removeJob6(l lease.Lease) {
	if l.Addr6.IsValid() {
		g.capture.RemoveJob(l.Addr6)
	}
}

// leaseAddr6 returns l with its IPv6 address filled in (a lease rebuilt
// from the history has none yet).
func (g *gateway) leaseAddr6(l lease.Lease) lease.Lease {
	if g.v6.on() && !l.Addr6.IsValid() {
		l.Addr6 = lease.Embed6(g.v6.prefix, l.Addr)
	}
	return l
}

// peerAddrs returns the tunnel addresses of l's WireGuard peer.
func peerAddrs(l lease.Lease) []netip.Addr {
	if l.Addr6.IsValid() {
		return []netip.Addr{l.Addr, l.Addr6}
	}
	return []netip.Addr{l.Addr}
}

// record6 fills in the IPv6 side of l's history record.
func (g *gateway) record6(r *store.LeaseRecord, l lease.Lease, block portblock.Range) {
	if !g.v6.on() || !l.Addr6.IsValid() {
		return
	}
	r.TunnelAddr6 = l.Addr6
	switch {
	case g.v6.own.IsValid():
		r.PublicAddr6, r.Own6 = g.ownAddr6(l), true
	case g.v6.egress.IsValid() && block != (portblock.Range{}):
		r.PublicAddr6 = g.v6.egress
		if !r.PublicAddr.IsValid() {
			r.PublicAddr, r.PortLo, r.PortHi = netip.IPv4Unspecified(), block.Lo, block.Hi
		}
	}
}

// lease6 fills in the IPv6 side of the lease a join returns: the job's
// address, the gateway's as a second resolver.
func (g *gateway) lease6(cl *control.Lease, l lease.Lease) {
	if !g.v6.on() || !l.Addr6.IsValid() {
		return
	}
	cl.Address6 = netip.PrefixFrom(l.Addr6, g.v6.prefix.Bits())
	cl.Gateway6 = g.v6.gw
	cl.DNS = append(cl.DNS, g.v6.gw)
	if g.v6.own.IsValid() {
		cl.PublicAddr6 = g.ownAddr6(l)
	} else if g.v6.egress.IsValid() {
		cl.PublicAddr6 = g.v6.egress
	}
	if cl.PublicAddr6.IsValid() {
		for _, x := range cl.Exposed {
			x.PublicAddr = cl.PublicAddr6
			if g.v6.own.IsValid() {
				x.PublicPort = x.Port.Port
			}
			cl.Exposed6 = append(cl.Exposed6, x)
		}
	}
}

// expose6 adds to ex the IPv6 listeners of the same mappings, on the
// job's IPv6 egress address, if it has one.
func (g *gateway) expose6(l lease.Lease, ex []forward.Exposure) []forward.Exposure {
	if len(ex) == 0 || !g.v6.on() || !l.Addr6.IsValid() {
		return ex
	}
	at, own := g.v6.egress, g.v6.own.IsValid()
	if own {
		at = g.ownAddr6(l)
	}
	if !at.IsValid() {
		return ex
	}
	out := append([]forward.Exposure(nil), ex...)
	for _, x := range ex {
		x.PublicAddr = at
		if own {
			// The job's own address: its own port, no translation.
			x.PublicPort = x.JobPort
		}
		out = append(out, x)
	}
	return out
}
