// SPDX-License-Identifier: MIT

package topology

// IPv6. Every link of the topology is dual-stack: beside its IPv4
// address each end has an address of a documentation /64 that mirrors the
// IPv4 /24 (198.51.100.0/24 ↔ 2001:db8:100::/64, 203.0.113.0/24 ↔
// 2001:db8:113::/64, ...), added with nodad, and duplicate address
// detection is off in every namespace, so no address waits for DAD. dmz's
// IPv6 default route leads to the outside through inet like its IPv4 one.
//
// WithSingleStackHosts adds two outside hosts behind inet (which then
// forwards, IPv4 and IPv6): v4h, IPv4 only (192.0.2.2, IPv6 disabled), and
// v6h, IPv6 only (2001:db8:116::2). StartNames serves names for them and
// for inet (NameDual: both families, NameV4: v4h, NameV6: v6h) from a DNS
// server in inet.
//
// WithIPv6OnlyCN leaves cn's link to dmz without an IPv4 address: the
// compute node reaches the gateway host over IPv6 only.

import (
	"fmt"
	"net/netip"
	"testing"
)

// IPv6 addresses of the topology (documentation prefix 2001:db8::/32).
var (
	CNAddr6      = netip.MustParseAddr("2001:db8:100::2")
	DMZAddrCN6   = netip.MustParseAddr("2001:db8:100::1")
	DMZAddrINET6 = netip.MustParseAddr("2001:db8:113::1")
	INETAddr6    = netip.MustParseAddr("2001:db8:113::2")

	CNPrefix6   = netip.MustParsePrefix("2001:db8:100::/64")
	INETPrefix6 = netip.MustParsePrefix("2001:db8:113::/64")

	// The second and third gateway hosts' links (WithSecondDMZ,
	// WithThirdDMZ).
	CNAddr26      = netip.MustParseAddr("2001:db8:101::2")
	DMZ2AddrCN6   = netip.MustParseAddr("2001:db8:101::1")
	DMZ2AddrINET6 = netip.MustParseAddr("2001:db8:114::1")
	INETAddr26    = netip.MustParseAddr("2001:db8:114::2")
	CNAddr36      = netip.MustParseAddr("2001:db8:102::2")
	DMZ3AddrCN6   = netip.MustParseAddr("2001:db8:102::1")
	DMZ3AddrINET6 = netip.MustParseAddr("2001:db8:115::1")
	INETAddr36    = netip.MustParseAddr("2001:db8:115::2")

	// The single-stack outside hosts (WithSingleStackHosts) and inet's
	// ends of their links.
	V4HostAddr     = netip.MustParseAddr("192.0.2.2")
	INETAddrV4Host = netip.MustParseAddr("192.0.2.1")
	V6HostAddr     = netip.MustParseAddr("2001:db8:116::2")
	INETAddrV6Host = netip.MustParseAddr("2001:db8:116::1")
)

// Names StartNames serves.
const (
	NameDual = "dual.airlock.test" // inet: INETAddr and INETAddr6
	NameV4   = "v4.airlock.test"   // v4h: V4HostAddr only
	NameV6   = "v6.airlock.test"   // v6h: V6HostAddr only
)

// Interface names of the single-stack hosts' links.
const (
	IfINETToV4Host = "v4h0"  // in inet
	IfINETToV6Host = "v6h0"  // in inet
	IfHostToINET   = "inet0" // in v4h and v6h
)

// WithSingleStackHosts adds the IPv4-only host v4h and the IPv6-only host
// v6h behind inet (see the file comment).
func WithSingleStackHosts() Option { return func(o *options) { o.single = true } }

// WithIPv6OnlyCN gives cn's link to dmz no IPv4 address.
func WithIPv6OnlyCN() Option { return func(o *options) { o.cn6only = true } }

// enableIPv6 turns IPv6 on in ns without duplicate address detection.
func enableIPv6(t testing.TB, ns string) {
	t.Helper()
	mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-q", "-w",
		"net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0",
		"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
		"net.ipv6.conf.all.accept_ra=0", "net.ipv6.conf.default.accept_ra=0")
}

// addr6 adds a to dev in ns as a /64, without DAD.
func addr6(t testing.TB, ns, dev string, a netip.Addr) {
	t.Helper()
	mustIP(t, "-n", ns, "-6", "addr", "add", a.String()+"/64", "dev", dev, "nodad")
}

// linkIPv6 gives the topology's links their IPv6 addresses and routes.
func (tp *Topology) linkIPv6(t testing.TB) {
	t.Helper()
	addr6(t, tp.CN, IfCNToDMZ, CNAddr6)
	addr6(t, tp.DMZ, IfDMZToCN, DMZAddrCN6)
	addr6(t, tp.DMZ, IfDMZToINET, DMZAddrINET6)
	addr6(t, tp.INET, IfINETToDMZ, INETAddr6)
	mustIP(t, "-n", tp.DMZ, "-6", "route", "add", "default", "via", INETAddr6.String())
	extra := func(ns, ifCN, ifINET string, cn, dmzCN, dmzINET, inet netip.Addr) {
		addr6(t, tp.CN, ifCN, cn)
		addr6(t, ns, IfDMZToCN, dmzCN)
		addr6(t, ns, IfDMZToINET, dmzINET)
		addr6(t, tp.INET, ifINET, inet)
		mustIP(t, "-n", ns, "-6", "route", "add", INETPrefix6.String(), "via", inet.String())
		mustIP(t, "-n", ns, "-6", "route", "add", "default", "via", inet.String())
	}
	if tp.DMZ2 != "" {
		extra(tp.DMZ2, IfCNToDMZ2, IfINETToDMZ2, CNAddr26, DMZ2AddrCN6, DMZ2AddrINET6, INETAddr26)
	}
	if tp.DMZ3 != "" {
		extra(tp.DMZ3, IfCNToDMZ3, IfINETToDMZ3, CNAddr36, DMZ3AddrCN6, DMZ3AddrINET6, INETAddr36)
	}
}

// nativeIPv6 routes cn to inet through dmz over IPv6 (WithNativeRouting).
func (tp *Topology) nativeIPv6(t testing.TB) {
	t.Helper()
	mustIP(t, "-n", tp.CN, "-6", "route", "add", "default", "via", DMZAddrCN6.String())
	mustIP(t, "-n", tp.INET, "-6", "route", "add", CNPrefix6.String(), "via", DMZAddrINET6.String())
	mustRun(t, "ip", "netns", "exec", tp.DMZ, "sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1")
}

// singleStackHosts makes v4h and v6h behind inet (WithSingleStackHosts).
// It returns their links for rate caps.
func (tp *Topology) singleStackHosts(t testing.TB) [][2]string {
	t.Helper()
	mustRun(t, "ip", "netns", "exec", tp.INET, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")

	mustIP(t, "-n", tp.INET, "link", "add", IfINETToV4Host, "type", "veth", "peer", "name", IfHostToINET, "netns", tp.V4Host)
	mustIP(t, "-n", tp.INET, "addr", "add", INETAddrV4Host.String()+"/24", "dev", IfINETToV4Host)
	mustIP(t, "-n", tp.V4Host, "addr", "add", V4HostAddr.String()+"/24", "dev", IfHostToINET)
	mustIP(t, "-n", tp.INET, "link", "set", IfINETToV4Host, "up")
	mustIP(t, "-n", tp.V4Host, "link", "set", IfHostToINET, "up")
	mustIP(t, "-n", tp.V4Host, "route", "add", "default", "via", INETAddrV4Host.String())

	mustIP(t, "-n", tp.INET, "link", "add", IfINETToV6Host, "type", "veth", "peer", "name", IfHostToINET, "netns", tp.V6Host)
	addr6(t, tp.INET, IfINETToV6Host, INETAddrV6Host)
	addr6(t, tp.V6Host, IfHostToINET, V6HostAddr)
	mustIP(t, "-n", tp.INET, "link", "set", IfINETToV6Host, "up")
	mustIP(t, "-n", tp.V6Host, "link", "set", IfHostToINET, "up")
	mustIP(t, "-n", tp.V6Host, "-6", "route", "add", "default", "via", INETAddrV6Host.String())
	// dmz, dmz2 and dmz3 reach both through their default routes to inet.
	return [][2]string{{tp.INET, IfINETToV4Host}, {tp.V4Host, IfHostToINET}, {tp.INET, IfINETToV6Host}, {tp.V6Host, IfHostToINET}}
}

// Names returns the zone StartNames serves.
func (tp *Topology) Names() map[string][]netip.Addr {
	z := map[string][]netip.Addr{NameDual: {tp.INETAddr, INETAddr6}}
	if tp.V4Host != "" {
		z[NameV4] = []netip.Addr{V4HostAddr}
		z[NameV6] = []netip.Addr{V6HostAddr}
	}
	return z
}

// StartNames starts a DNS server on inet's IPv4 address serving Names and
// extra (which may override them), and returns its address.
func (tp *Topology) StartNames(t testing.TB, extra map[string][]netip.Addr) netip.Addr {
	t.Helper()
	z := tp.Names()
	for k, v := range extra {
		z[k] = v
	}
	return tp.StartDNSZone(t, tp.INET, tp.INETAddr, z)
}

// listenAny returns the wildcard host:port a server in ns listens on: both
// families, except in the IPv4-only host v4h.
func (tp *Topology) listenAny(ns string, port int) string {
	if ns == tp.V4Host {
		return fmt.Sprintf("0.0.0.0:%d", port)
	}
	return fmt.Sprintf("[::]:%d", port)
}
