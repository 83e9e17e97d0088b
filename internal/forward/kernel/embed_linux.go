// SPDX-License-Identifier: MIT

package kernel

// IPv6 in kernel mode. Theory of operation:
//
// With an IPv6 tunnel address (Config.Addrs), the TUN also carries it and
// jobs' IPv6 packets are forwarded like their IPv4 ones, by the same table
// (family inet) and the same chains; the rules that look at addresses are
// built once per family from the family table (family_linux.go). What only
// IPv6 has, this file builds:
//
//   - from_jobs: `ip6 saddr` must be in the IPv6 tunnel subnet; new
//     flows jump to floor6, the IPv6 safety
//     floor: unspecified, loopback and multicast, the IPv6 tunnel subnet
//     and the routed prefix, the IPv4-mapped range (IPv4 destinations go
//     over IPv4), and the images of the IPv4 floor and tunnel subnet in
//     every IPv4-embedding form of policy.Embeddings (NAT64, local-use
//     NAT64, IPv4-compatible, 6to4, Teredo server and client).
//   - An embedding's image is not always a prefix: Teredo's client
//     address (inverted) and local-use NAT64's IPv4 address sit after free
//     bits, so addresses are matched as bits under a mask (mrange), which
//     nftables evaluates like a prefix (load, and, compare).
//   - egress_policy: the policy's IPv6 prefixes, with the protected ranges
//     of the built-in list and their embedded images (protected6), most
//     specific first, exceptions (the globally reachable services inside
//     2001::/23) cut out of the ranges around them. An allow rule opens a
//     protected range only if it names it, as policy.Decide says; where an
//     exception lies inside a range the rule does not name, the exception
//     gets an allow rule of its own (allowConds).
//   - A job's IPv6 tunnel address is one of its Job.Addrs. Jobs on the
//     shared egress address are source-NATed to the gateway's IPv6 egress
//     address (the job's IPv6 egress entry, which the gateway takes from
//     --egress-addr or the host's default IPv6 route; else the
//     configured one; without any, masquerade) and their port block, as
//     over IPv4. With --egress-prefix (the site routes the prefix to the
//     gateway host, and New routes it on to the TUN), a job has its own
//     public address in the prefix (an egress entry with Own): its tunnel
//     address is mapped to it one to one (`snat ip6 to OWN`, no port
//     range: ports are kept), the block limit skips it (set own6), and an
//     exposed port is the job's own port at that address (the gateway
//     makes it so; DNAT of the address only). Unsolicited packets to an
//     own address are routed into the TUN and dropped by the forward
//     chain like any other.
//   - ICMPv6: echo requests are policy-decided like ICMP; errors for
//     tracked flows (packet too big, unreachable, time exceeded) are
//     related and pass both ways, so path MTU discovery works; TCP MSS is
//     clamped to the route's MTU for both families (rt mtu knows the
//     header sizes).
//   - net.ipv6.conf.all.forwarding is switched on and restored like
//     ip_forward (the family table's forwarding sysctl).

import (
	"math/bits"
	"net/netip"
	"sort"

	"github.com/google/nftables/expr"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// Names of the IPv6 objects.
const (
	chainFloor6 = "floor6"
	setOwn      = "own6"
)

// mrange is a set of IPv6 addresses: those whose bits under mask equal
// val. A prefix is one; so is the image of an IPv4 prefix inside an
// IPv4-embedding form, whose mask may have a gap (Teredo's client
// address). Rule is the built-in rule that covers it ("" for a globally
// reachable exception).
type mrange struct {
	val, mask [16]byte
	rule      string
}

// prefixRange returns the mrange of prefix p.
func prefixRange(p netip.Prefix, rule string) mrange {
	var m mrange
	m.rule = rule
	for i := 0; i < p.Bits(); i++ {
		m.mask[i/8] |= 1 << (7 - i%8)
	}
	a := p.Masked().Addr().As16()
	for i := range a {
		m.val[i] = a[i] & m.mask[i]
	}
	return m
}

// imageRange returns the addresses of embedding e that embed an address
// of the IPv4 prefix p4.
func imageRange(e policy.Embedding, p4 netip.Prefix, rule string) mrange {
	m := prefixRange(e.Prefix, rule)
	a := p4.Masked().Addr().As4()
	for i := 0; i < p4.Bits(); i++ {
		bit := i + e.Off
		m.mask[bit/8] |= 1 << (7 - bit%8)
		v := a[i/8] >> (7 - i%8) & 1
		if e.Inverted {
			v ^= 1
		}
		m.val[bit/8] = m.val[bit/8]&^(1<<(7-bit%8)) | v<<(7-bit%8)
	}
	return m
}

// spec is how specific m is, comparable with prefix lengths: the position
// after its last masked bit. policy.Builtin's image prefixes (which keep
// the address's bits before the IPv4 address) have this length.
func (m mrange) spec() int {
	for i := 15; i >= 0; i-- {
		if m.mask[i] != 0 {
			return i*8 + 8 - bits.TrailingZeros8(m.mask[i])
		}
	}
	return 0
}

func (m mrange) contains(a netip.Addr) bool {
	b := a.As16()
	for i := range b {
		if b[i]&m.mask[i] != m.val[i] {
			return false
		}
	}
	return true
}

// meets reports whether m and o share an address.
func (m mrange) meets(o mrange) bool {
	for i := range m.val {
		if (m.val[i]^o.val[i])&m.mask[i]&o.mask[i] != 0 {
			return false
		}
	}
	return true
}

// within reports whether every address of m is in o.
func (m mrange) within(o mrange) bool {
	for i := range m.val {
		if o.mask[i]&^m.mask[i] != 0 || m.val[i]&o.mask[i] != o.val[i] {
			return false
		}
	}
	return true
}

// and returns the intersection of m and o, which must meet.
func (m mrange) and(o mrange) mrange {
	r := mrange{rule: m.rule}
	for i := range m.val {
		r.mask[i] = m.mask[i] | o.mask[i]
		r.val[i] = m.val[i] | o.val[i]
	}
	return r
}

// match6 matches the IPv6 source (src) or destination address against m
// (op CmpOpEq: in m, CmpOpNeq: not in m). The caller must have matched
// IPv6 first.
func match6(src bool, op expr.CmpOp, m mrange) []expr.Any {
	return maskedMatch(v6Family, src, op, m.val[:], m.mask[:])
}

// embeddings returns the IPv4-embedding forms whose images kernel mode
// matches: all but IPv4-mapped, which floor6 refuses as a whole.
func embeddings() []policy.Embedding {
	var out []policy.Embedding
	for _, e := range policy.Embeddings() {
		if !e.Prefix.Addr().Is4In6() {
			out = append(out, e)
		}
	}
	return out
}

// floor6 lists the IPv6 destinations no job may reach, whatever the
// policy (see the theory of operation).
func (r ruleset) floor6() []mrange {
	var out []mrange
	for _, p := range policy.Prefixes(policy.RuleFloor) {
		if p.Addr().Is6() {
			out = append(out, prefixRange(p, policy.RuleFloor))
		}
	}
	out = append(out, prefixRange(netip.MustParsePrefix("::ffff:0:0/96"), policy.RuleFloor))
	out = append(out, prefixRange(r.tunnels[ipfamily.V6.Index].Masked(), policy.RuleFloor))
	if r.own.IsValid() {
		out = append(out, prefixRange(r.own.Masked(), policy.RuleFloor))
	}
	for _, e := range embeddings() {
		for _, p := range r.floorV4() {
			out = append(out, imageRange(e, p, policy.RuleFloor))
		}
	}
	return out
}

// floor6Rules are the rules of chain floor6. They go to chain floor, which
// counts the denial under policy.RuleFloor like the IPv4 floor's.
func (r ruleset) floor6Rules() [][]expr.Any {
	var rules [][]expr.Any
	for _, m := range r.floor6() {
		rules = append(rules, cat(match6(false, expr.CmpOpEq, m), []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainFloor}}))
	}
	return rules
}

// protected6 lists the IPv6 ranges of the built-in list that only an
// explicit allow opens, with the globally reachable exceptions (rule ""),
// and the images of the protected IPv4 ranges in every embedding form,
// most specific first.
func protected6() []mrange {
	var out []mrange
	for _, pr := range policy.Ranges() {
		if pr.Prefix.Addr().Is6() && pr.Rule != policy.RuleFloor {
			out = append(out, prefixRange(pr.Prefix, pr.Rule))
		}
	}
	for _, e := range embeddings() {
		for _, pr := range protectedV4() {
			out = append(out, imageRange(e, pr.Prefix, pr.Rule))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].spec() > out[j].spec() })
	return out
}

// cond is one address condition of a rule: in (or, neq, not in) m.
type cond struct {
	m   mrange
	neq bool
}

func condExprs(cs []cond) []expr.Any {
	var e []expr.Any
	for _, c := range cs {
		op := expr.CmpOpEq
		if c.neq {
			op = expr.CmpOpNeq
		}
		e = append(e, match6(false, op, c.m)...)
	}
	return e
}

// allowConds returns the destination conditions of an IPv6 allow rule for
// prefix pf: one conjunction per nftables rule, which together hold
// exactly the destinations in pf that policy.Decide lets the rule allow.
// A protected range that pf does not name is cut out (the outermost ones
// only); an exception inside a cut range gets a rule of its own, with the
// protected ranges inside it cut out in turn.
func allowConds(pf netip.Prefix) [][]cond {
	all := protected6()
	p := prefixRange(pf, "")
	var out [][]cond
	var walk func(region []cond, area mrange, minSpec int)
	walk = func(region []cond, area mrange, minSpec int) {
		var cut []mrange
		for _, x := range all {
			if x.rule == "" || x.spec() <= minSpec || !x.meets(area) || p.within(x) {
				continue
			}
			cut = append(cut, x)
		}
		outer := outermost(cut)
		rule := append([]cond(nil), region...)
		for _, x := range outer {
			rule = append(rule, cond{m: x, neq: true})
		}
		out = append(out, rule)
		for _, x := range outer {
			for _, e := range exceptionsIn(all, x) {
				if e.meets(area) {
					walk(append(append([]cond(nil), region...), cond{m: e}), area.and(e), e.spec())
				}
			}
		}
	}
	var region []cond
	if pf.Bits() > 0 {
		region = []cond{{m: p}}
	}
	walk(region, p, -1)
	return out
}

// outermost returns the ranges of rs that lie inside no other of them (of
// two equal ones, the first).
func outermost(rs []mrange) []mrange {
	var out []mrange
	for i, x := range rs {
		inner := false
		for j, y := range rs {
			if i != j && x.within(y) && !(y.within(x) && j > i) {
				inner = true
				break
			}
		}
		if !inner {
			out = append(out, x)
		}
	}
	return out
}

// exceptionsIn returns the outermost exceptions (rule "") of all strictly
// inside x.
func exceptionsIn(all []mrange, x mrange) []mrange {
	var exc []mrange
	for _, e := range all {
		if e.rule == "" && e.spec() > x.spec() && e.within(x) {
			exc = append(exc, e)
		}
	}
	return outermost(exc)
}

// denyConds returns, for each protected IPv6 range in the order of
// protected6, its deny conditions: in the range, not in the outermost
// exceptions inside it.
func denyConds() []struct {
	rule  string
	conds []cond
} {
	all := protected6()
	var out []struct {
		rule  string
		conds []cond
	}
	for _, x := range all {
		if x.rule == "" {
			continue
		}
		cs := []cond{{m: x}}
		for _, e := range exceptionsIn(all, x) {
			cs = append(cs, cond{m: e, neq: true})
		}
		out = append(out, struct {
			rule  string
			conds []cond
		}{x.rule, cs})
	}
	return out
}
