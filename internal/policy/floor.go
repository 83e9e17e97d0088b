// SPDX-License-Identifier: MIT

package policy

// The built-in floor: one list of the destinations that are not plain
// global unicast, and one function, Builtin, that says which built-in rule
// covers a destination. Policy.Decide (user mode, per flow) and the kernel
// backend's nftables rules (compiled from Ranges) both come from here.
//
// Principle: a destination that is not globally reachable (IANA
// special-purpose registries, "Globally Reachable" false) and could be
// routed to something inside the site is denied unless an allow rule names
// it; what no policy may open at all is the floor (RuleFloor). Exceptions,
// each argued at its entry: the documentation prefixes stay open (they lead
// nowhere by definition, and tests and examples use them); a few IETF
// anycast services inside 2001::/23 are globally reachable and stay open;
// 192.0.0.0/24 is protected as a whole although two of its /32s are
// globally reachable anycast services (PCP, TURN): the block is IETF
// protocol space that sites use on-link (DS-Lite, NAT64 discovery), and
// jobs have no use for PCP or TURN anycast through a gateway.
//
// Addresses that embed an IPv4 address (IPv4-mapped, IPv4-compatible, the
// NAT64 prefixes 64:ff9b::/96 and 64:ff9b:1::/48, 6to4 2002::/16, Teredo
// 2001::/32) are judged by each embedded address as well: a NAT64 or 6to4
// gateway on the way would deliver them to that IPv4 address. The
// protected prefix of such a destination is the image of the IPv4
// address's protected range inside the embedding (169.254.0.0/16 becomes
// 64:ff9b::a9fe:0/112), so an allow rule opens it only if it names that
// image; an IPv4 allow rule does not open the IPv6 forms, nor does an
// allow of the NAT64 prefix as a whole.

import "net/netip"

// Names of the built-in rules that this file adds to the ones in
// policy.go.
const (
	// RuleInternal protects non-global ranges that lead inside a site or
	// a cloud: shared address space 100.64.0.0/10, 192.0.0.0/24,
	// benchmarking and reserved ranges, local-use NAT64, site-local and
	// segment-routing IPv6.
	RuleInternal = "builtin-internal"
	// RuleMetadata protects well-known cloud instance-metadata and
	// platform endpoints; an allow rule must name the endpoint itself (or
	// a prefix inside it), so opening a whole link-local, private or
	// shared range does not open them.
	RuleMetadata = "builtin-metadata"
)

// Range is one entry of the built-in list.
type Range struct {
	Prefix netip.Prefix
	// Rule is the built-in rule that covers the range: RuleFloor (no
	// policy opens it), RuleLinkLocal, RulePrivate, RuleInternal or
	// RuleMetadata (an allow rule that names the range opens it), or ""
	// for a globally reachable exception inside a wider protected range.
	Rule string
	// Name says what the range is.
	Name string
}

// ranges is the built-in list. The most specific entry that holds an
// address decides (Builtin). It is never modified.
var ranges = []Range{
	// The floor: nothing can open these.
	{mp("0.0.0.0/8"), RuleFloor, "this network (RFC 791)"},
	{mp("127.0.0.0/8"), RuleFloor, "loopback (RFC 1122)"},
	{mp("224.0.0.0/4"), RuleFloor, "multicast (RFC 5771)"},
	{mp("255.255.255.255/32"), RuleFloor, "limited broadcast (RFC 919)"},
	{mp("::/128"), RuleFloor, "unspecified (RFC 4291)"},
	{mp("::1/128"), RuleFloor, "loopback (RFC 4291)"},
	{mp("ff00::/8"), RuleFloor, "multicast (RFC 4291)"},

	{mp("169.254.0.0/16"), RuleLinkLocal, "link-local (RFC 3927)"},
	{mp("fe80::/10"), RuleLinkLocal, "link-local unicast (RFC 4291)"},

	{mp("10.0.0.0/8"), RulePrivate, "private-use (RFC 1918)"},
	{mp("172.16.0.0/12"), RulePrivate, "private-use (RFC 1918)"},
	{mp("192.168.0.0/16"), RulePrivate, "private-use (RFC 1918)"},
	{mp("fc00::/7"), RulePrivate, "unique-local (RFC 4193)"},

	{mp("100.64.0.0/10"), RuleInternal, "shared address space: carrier-grade NAT, cloud-internal (RFC 6598)"},
	{mp("192.0.0.0/24"), RuleInternal, "IETF protocol assignments: DS-Lite, NAT64 discovery, dummy (RFC 6890)"},
	{mp("198.18.0.0/15"), RuleInternal, "benchmarking (RFC 2544): lab networks"},
	{mp("240.0.0.0/4"), RuleInternal, "reserved (RFC 1112): used as internal space by some clouds and clusters"},
	{mp("64:ff9b:1::/48"), RuleInternal, "local-use IPv4/IPv6 translation (RFC 8215)"},
	{mp("100::/64"), RuleInternal, "discard-only (RFC 6666)"},
	{mp("100:0:0:1::/64"), RuleInternal, "dummy IPv6 prefix (RFC 9780)"},
	{mp("2001::/23"), RuleInternal, "IETF protocol assignments (RFC 2928)"},
	{mp("2001:2::/48"), RuleInternal, "benchmarking (RFC 5180)"},
	{mp("2001:10::/28"), RuleInternal, "deprecated ORCHID (RFC 4843)"},
	{mp("5f00::/16"), RuleInternal, "segment routing SIDs (RFC 9602): local to an SR domain"},
	{mp("fec0::/10"), RuleInternal, "deprecated site-local (RFC 3879)"},

	// Globally reachable services inside 2001::/23 (registry: true).
	{mp("2001::/32"), "", "Teredo (RFC 4380): judged by its embedded server and client addresses"},
	{mp("2001:1::1/128"), "", "PCP anycast (RFC 7723)"},
	{mp("2001:1::2/128"), "", "TURN anycast (RFC 8155)"},
	{mp("2001:1::3/128"), "", "DNS-SD SRP anycast (RFC 9665)"},
	{mp("2001:3::/32"), "", "AMT (RFC 7450)"},
	{mp("2001:4:112::/48"), "", "AS112-v6 (RFC 7535)"},
	{mp("2001:20::/28"), "", "ORCHIDv2 (RFC 7343)"},
	{mp("2001:30::/28"), "", "drone remote ID DETs (RFC 9374)"},

	// Cloud instance-metadata and platform endpoints.
	{mp("169.254.169.254/32"), RuleMetadata, "instance metadata: AWS, GCP, Azure, OCI, OpenStack, DigitalOcean"},
	{mp("169.254.170.2/32"), RuleMetadata, "AWS ECS task metadata and credentials"},
	{mp("100.100.100.200/32"), RuleMetadata, "Alibaba Cloud instance metadata"},
	{mp("168.63.129.16/32"), RuleMetadata, "Azure WireServer (platform agent, DNS, health probes)"},
	{mp("fd00:ec2::254/128"), RuleMetadata, "AWS instance metadata (IPv6)"},
	{mp("fd20:ce::254/128"), RuleMetadata, "GCP metadata server (IPv6)"},
}

func mp(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// Ranges returns a copy of the built-in list: every entry with its rule.
// The gateway's tunnel subnet and the host's own addresses are not in it;
// Builtin adds them.
func Ranges() []Range { return append([]Range(nil), ranges...) }

// Prefixes returns the prefixes of the built-in list covered by one of
// rules, in list order.
func Prefixes(rules ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, r := range ranges {
		for _, want := range rules {
			if r.Rule == want {
				out = append(out, r.Prefix)
				break
			}
		}
	}
	return out
}

// Embedded returns the IPv4 addresses that a embeds (IPv4-mapped and
// -compatible, NAT64 64:ff9b::/96 and 64:ff9b:1::/48 (the last 32 bits),
// 6to4, Teredo server and client), with a prefix length for each that
// says where the IPv4 address starts in a (its image prefix is the IPv4
// prefix's bits plus that offset, with a's other leading bits). n is how
// many it returned (0, 1 or 2).
func Embedded(a netip.Addr) (v4 [2]netip.Addr, off [2]int, n int) {
	if !a.Is6() {
		return v4, off, 0
	}
	b := a.As16()
	at := func(i int, xor byte) netip.Addr {
		return netip.AddrFrom4([4]byte{b[i] ^ xor, b[i+1] ^ xor, b[i+2] ^ xor, b[i+3] ^ xor})
	}
	switch {
	case a.Is4In6(), pfxCompat.Contains(a), pfxNAT64.Contains(a), pfxNAT64Local.Contains(a):
		v4[0], off[0], n = at(12, 0), 96, 1
	case pfx6to4.Contains(a):
		v4[0], off[0], n = at(2, 0), 16, 1
	case pfxTeredo.Contains(a):
		v4[0], off[0] = at(4, 0), 32
		v4[1], off[1] = at(12, 0xff), 96
		n = 2
	}
	return v4, off, n
}

// Embedding is one way an IPv6 address embeds an IPv4 address: inside
// Prefix, the 32 bits from Off (inverted if Inverted) are the IPv4
// address. Embedded is the per-address form of the same list.
type Embedding struct {
	Prefix   netip.Prefix
	Off      int
	Inverted bool
	Name     string
}

// Embeddings returns the IPv4-embedding forms that Embedded recognises, for
// code that compiles the built-in list into matches (kernel mode's
// nftables rules).
func Embeddings() []Embedding {
	return []Embedding{
		{mp("::ffff:0:0/96"), 96, false, "IPv4-mapped"},
		{pfxCompat, 96, false, "IPv4-compatible"},
		{pfxNAT64, 96, false, "NAT64"},
		{pfxNAT64Local, 96, false, "local-use NAT64"},
		{pfx6to4, 16, false, "6to4"},
		{pfxTeredo, 32, false, "Teredo server"},
		{pfxTeredo, 96, true, "Teredo client"},
	}
}

var (
	pfxCompat     = mp("::/96")
	pfxNAT64      = mp("64:ff9b::/96")
	pfxNAT64Local = mp("64:ff9b:1::/48")
	pfx6to4       = mp("2002::/16")
	pfxTeredo     = mp("2001::/32")
)

// Builtin returns the built-in rule that covers the destination a and the
// prefix it protects, or "" if none does. It is the one definition of the
// floor and the built-in protections:
//
//   - RuleFloor: a is invalid, in a floor range of the list, or in one of
//     the gateway's tunnel subnets (tunnels; their addresses are its own,
//     whose DNS and echo the gateway serves itself before any flow is
//     decided). No allow rule opens it.
//   - RuleHost if host (a is one of the gateway host's own addresses), with
//     the single address as the protected prefix.
//   - otherwise the rule of the most specific list entry that holds a, and
//     that entry's prefix.
//
// An address that embeds IPv4 addresses (Embedded) is also judged by each
// of them; the floor wins, then the most specific protected prefix (for
// an embedded address, its image in a). IPv4-mapped addresses are judged
// as the IPv4 address they map. It allocates nothing.
func Builtin(a netip.Addr, tunnels []netip.Prefix, host bool) (rule string, protected netip.Prefix) {
	a = a.Unmap()
	if !a.IsValid() {
		return RuleFloor, netip.Prefix{}
	}
	rule, protected = builtin1(a, tunnels)
	if rule == RuleFloor {
		return rule, protected
	}
	v4, off, n := Embedded(a)
	for i := 0; i < n; i++ {
		r, p := builtin1(v4[i], tunnels)
		if r == RuleFloor {
			return RuleFloor, p
		}
		if r == "" {
			continue
		}
		img := image(a, p, off[i], i == 1)
		if rule == "" || img.Bits() > protected.Bits() {
			rule, protected = r, img
		}
	}
	if host {
		return RuleHost, netip.PrefixFrom(a, a.BitLen())
	}
	return rule, protected
}

// builtin1 judges a alone: the tunnel subnet, then the most specific list
// entry.
func builtin1(a netip.Addr, tunnels []netip.Prefix) (string, netip.Prefix) {
	for _, t := range tunnels {
		if t.IsValid() && t.Masked().Contains(a) {
			return RuleFloor, t.Masked()
		}
	}
	best := -1
	for i := range ranges {
		if ranges[i].Prefix.Contains(a) && (best < 0 || ranges[i].Prefix.Bits() > ranges[best].Prefix.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return "", netip.Prefix{}
	}
	return ranges[best].Rule, ranges[best].Prefix
}

// image returns the prefix of the IPv6 addresses that share a's bits
// before off and embed an address of the IPv4 prefix p at off (inverted
// for Teredo's client address).
func image(a netip.Addr, p netip.Prefix, off int, inverted bool) netip.Prefix {
	b := a.As16()
	p4 := p.Addr().As4()
	for i := 0; i < 4; i++ {
		if inverted {
			p4[i] ^= 0xff
		}
		b[off/8+i] = p4[i]
	}
	return netip.PrefixFrom(netip.AddrFrom16(b), off+p.Bits()).Masked()
}
