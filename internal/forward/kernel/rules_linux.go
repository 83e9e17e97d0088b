// SPDX-License-Identifier: MIT

package kernel

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Names of Airlock's nftables objects.
const (
	TableName       = "airlock"
	chainPost       = "postrouting"
	chainPre        = "prerouting"
	chainForward    = "forward"
	chainFromJobs   = "from_jobs"
	chainInput      = "input"
	chainToHost     = "to_host"
	chainState      = "state"
	chainRefuse     = "refuse"
	jobTagPrefix    = "airlock job "
	exposeTagPrefix = "airlock expose "
	stateTagPrefix  = "airlock ip_forward="
	// setConns counts each job's connections per destination (job
	// address . destination address . destination port): a job's port
	// block holds at most one connection per port to one destination.
	setConns = "conns"
	// blockLimitTag marks the block limit rules, whose counters
	// BlockRefusals reads.
	blockLimitTag = "airlock block limit"
	// connlimitInvert is NFT_CONNLIMIT_F_INV: "ct count over N".
	connlimitInvert = 1
)

// floorV4 lists the IPv4 destinations no job may reach, whatever the
// policy: the floor of policy.Builtin (this network, loopback, multicast,
// broadcast) from the one list in package policy, and the tunnel subnet.
// The protected ranges are the policy's (policy_linux.go).
func (r ruleset) floorV4() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range policy.Prefixes(policy.RuleFloor) {
		if p.Addr().Is4() {
			out = append(out, p)
		}
	}
	return append(out, r.addr.Masked())
}

// ruleset describes the table for one forwarder: everything the rules
// depend on. Its methods build expressions only; they touch no kernel
// state, so they are testable without privileges.
type ruleset struct {
	tun    string       // TUN interface name
	addr   netip.Prefix // gateway tunnel address / subnet length
	egress netip.Addr   // public source address of SNAT
	// blockSize is the number of ports in every job's block; 0 means no
	// per-destination connection limit.
	blockSize uint32
	// addr6 is the gateway's IPv6 tunnel address / subnet length; the
	// zero Prefix means no IPv6 (from_jobs drops it).
	addr6 netip.Prefix
	// egress6 is the public IPv6 source address of SNAT; the zero Addr
	// means none (jobs without an own address are refused IPv6).
	egress6 netip.Addr
	// prefix6 is the routed --egress-prefix6 that jobs' own public
	// addresses come from; the zero Prefix means none.
	prefix6 netip.Prefix
}

// v6 reports whether the ruleset forwards IPv6.
func (r ruleset) v6() bool { return r.addr6.IsValid() }

// connsSet is the dynamic set behind the per-destination connection limit.
func connsSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{
		Table:         t,
		Name:          setConns,
		KeyType:       nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr, nftables.TypeInetService),
		Dynamic:       true,
		Concatenation: true,
	}
}

// connsSet6 is connsSet for IPv6.
func connsSet6(t *nftables.Table) *nftables.Set {
	return &nftables.Set{
		Table:         t,
		Name:          setConns6,
		KeyType:       nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeIP6Addr, nftables.TypeInetService),
		Dynamic:       true,
		Concatenation: true,
	}
}

// own6Set holds the IPv6 tunnel addresses of the jobs with an own public
// address: they have no port block, so the block limit does not apply.
func own6Set(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: setOwn6, KeyType: nftables.TypeIP6Addr}
}

// blockLimitRules refuse a job's new TCP or UDP flow to a destination that
// already has as many of the job's flows as its block has ports: SNAT would
// find no free source port and the kernel would drop the packet silently,
// leaving the job to time out. `ct state new meta l4proto P add @conns
// { ip saddr . ip daddr . P dport ct count over N } goto refuse`.
func (r ruleset) blockLimitRules() [][]expr.Any {
	if r.blockSize == 0 {
		return nil
	}
	// A concatenated key fills consecutive 32-bit registers from 8 (the
	// first 16-byte register, 1): IPv4 saddr in 8, daddr in 9, dport in
	// 10; IPv6 saddr in 8-11, daddr in 12-15, dport in 16.
	type family struct {
		nf          []expr.Any
		off, n, reg uint32 // saddr offset and length, daddr register
		set         string
		skip        []expr.Any
	}
	fams := []family{{nf: nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), off: 12, n: 4, reg: 9, set: setConns}}
	if r.v6() {
		fams = append(fams, family{nf: nfproto6(), off: 8, n: 16, reg: 12, set: setConns6, skip: []expr.Any{
			// Jobs with an own address keep their ports: no block.
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
			&expr.Lookup{SourceRegister: 1, SetName: setOwn6, Invert: true},
		}})
	}
	var rules [][]expr.Any
	for _, f := range fams {
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			rules = append(rules, cat(f.nf, ctState(expr.CtStateBitNEW), l4proto(proto), f.skip, []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.off, Len: f.n},
				&expr.Payload{DestRegister: f.reg, Base: expr.PayloadBaseNetworkHeader, Offset: f.off + f.n, Len: f.n},
				&expr.Payload{DestRegister: f.reg + f.n/4, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Dynset{
					SrcRegKey: 1,
					SetName:   f.set,
					Operation: uint32(unix.NFT_DYNSET_OP_ADD),
					Exprs:     []expr.Any{&expr.Connlimit{Count: r.blockSize, Flags: connlimitInvert}},
				},
				// Counts refusals for admins (nft list table inet airlock).
				&expr.Counter{},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainRefuse},
			}))
		}
	}
	return rules
}

// ifname returns an interface name as nftables compares it: NUL-padded to
// IFNAMSIZ.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func metaCmp(key expr.MetaKey, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

func iifname(op expr.CmpOp, n string) []expr.Any { return metaCmp(expr.MetaKeyIIFNAME, op, ifname(n)) }
func oifname(op expr.CmpOp, n string) []expr.Any { return metaCmp(expr.MetaKeyOIFNAME, op, ifname(n)) }
func l4proto(p byte) []expr.Any                  { return metaCmp(expr.MetaKeyL4PROTO, expr.CmpOpEq, []byte{p}) }
func nfproto(op expr.CmpOp, p byte) []expr.Any   { return metaCmp(expr.MetaKeyNFPROTO, op, []byte{p}) }

// ip4 matches the IPv4 source (src) or destination address against p.
// The caller must have matched nfproto ipv4 first.
func ip4(src bool, op expr.CmpOp, p netip.Prefix) []expr.Any {
	off := uint32(16)
	if src {
		off = 12
	}
	e := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
	a := p.Masked().Addr().As4()
	if p.Bits() < 32 {
		m := netipMask4(p.Bits())
		e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: m[:], Xor: make([]byte, 4)})
	}
	return append(e, &expr.Cmp{Op: op, Register: 1, Data: a[:]})
}

func netipMask4(bits int) [4]byte {
	var m [4]byte
	for i := 0; i < bits; i++ {
		m[i/8] |= 1 << (7 - i%8)
	}
	return m
}

// dport matches the transport destination port; l4proto must be matched
// first.
func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// ctState matches if the conntrack state has any of bits.
func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ctStateNone matches if the conntrack state has none of bits.
func ctStateNone(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
	}
}

// ipsDstNAT is the conntrack status bit IPS_DST_NAT: the connection was
// destination-NATed (an exposure's DNAT rule matched its first packet).
const ipsDstNAT = 1 << 5

// ctStatus matches if the conntrack status has any of bits.
func ctStatus(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// fibDaddrType matches the route type of the destination (RTN_LOCAL, ...).
func fibDaddrType(rtn uint32) []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(rtn)},
	}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// mssClamp sets the MSS option of TCP SYNs (SYN set, RST clear) to the
// route's MTU minus headers: `tcp flags & (syn|rst) == syn tcp option
// maxseg size set rt mtu`.
func mssClamp() []expr.Any {
	return cat(l4proto(unix.IPPROTO_TCP), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x02 | 0x04}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}},
		&expr.Rt{Register: 1, Key: expr.RtTCPMSS},
		// rt mtu is in host byte order, the option in network order (nft
		// adds the same conversion); without it the kernel sees a larger
		// MSS and, as it only ever lowers one, changes nothing.
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{SourceRegister: 1, Type: 2, Offset: 2, Len: 2, Op: expr.ExthdrOpTcpopt},
	})
}

// forwardRules are the rules of the forward base chain, in order.
func (r ruleset) forwardRules() [][]expr.Any {
	rules := [][]expr.Any{
		cat(iifname(expr.CmpOpEq, r.tun), mssClamp()),
		cat(oifname(expr.CmpOpEq, r.tun), mssClamp()),
	}
	if r.v6() {
		// IPv6 link-local destinations are on-link on the TUN, so the
		// host routes them back into it: the policy decides them (and
		// counts the denial under its rule, builtin-link-local unless a
		// rule says otherwise); what it allows is refused by the floor
		// below like any job-to-job packet.
		rules = append(rules, cat(iifname(expr.CmpOpEq, r.tun), oifname(expr.CmpOpEq, r.tun), nfproto6(),
			ip6(false, expr.CmpOpEq, netip.MustParsePrefix("fe80::/10")),
			ctStateNone(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), []expr.Any{jump(chainPolicy)}))
	}
	return append(rules,
		cat(iifname(expr.CmpOpEq, r.tun), oifname(expr.CmpOpEq, r.tun), []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainFloor}}),
		cat(iifname(expr.CmpOpEq, r.tun), []expr.Any{jump(chainFromJobs)}),
		cat(oifname(expr.CmpOpEq, r.tun), ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), []expr.Any{verdict(expr.VerdictAccept)}),
		cat(oifname(expr.CmpOpEq, r.tun), ctStatus(ipsDstNAT), []expr.Any{verdict(expr.VerdictAccept)}),
		cat(oifname(expr.CmpOpEq, r.tun), []expr.Any{verdict(expr.VerdictDrop)}),
	)
}

// refuseRules answer a refused packet the way a closed port would (TCP
// reset, ICMP port unreachable), so that jobs fail at once instead of
// waiting for a timeout. The kernel sends nothing for broadcast and
// multicast destinations.
func refuseRules() [][]expr.Any {
	return [][]expr.Any{
		cat(l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}),
		{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}},
	}
}

// chainFloor counts what the floor refuses (as policy.RuleFloor in
// PolicyDrops) and refuses it: a job's flow to the floor's destinations,
// to another job, or to the gateway's tunnel address beyond DNS and echo.
const chainFloor = "floor"

// floorChain returns the floor chain.
func floorChain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: chainFloor, Table: t}
}

// floorRule is the floor chain's one rule, tagged as a policy rule so
// that PolicyDrops reads its counter under policy.RuleFloor.
func floorRule(t *nftables.Table) *nftables.Rule {
	return &nftables.Rule{Table: t, Chain: floorChain(t), UserData: policyTag(policy.RuleFloor),
		Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainRefuse}}}
}

// floorRules send the floor's IPv4 destinations to the floor chain.
func (r ruleset) floorRules() [][]expr.Any {
	floor := []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainFloor}}
	var rules [][]expr.Any
	for _, p := range r.floorV4() {
		rules = append(rules, cat(nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(false, expr.CmpOpEq, p), floor))
	}
	return rules
}

// fromJobsRules are the safety floor for traffic from jobs to the outside,
// then the jobs' flow limits (limits_linux.go) and the block limit.
func (r ruleset) fromJobsRules() [][]expr.Any {
	drop := []expr.Any{verdict(expr.VerdictDrop)}
	refuse := []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainRefuse}}
	rules := [][]expr.Any{
		cat(nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(true, expr.CmpOpNeq, r.addr.Masked()), drop),
	}
	if !r.v6() {
		rules = append(rules, cat(nfproto(expr.CmpOpNeq, unix.NFPROTO_IPV4), drop))
	} else {
		rules = append(rules, cat(nfproto6(), ip6(true, expr.CmpOpNeq, r.addr6.Masked()), drop))
		rules = append(rules,
			// The IPv6 floor is long: new flows only.
			cat(nfproto6(), ctStateNone(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), []expr.Any{jump(chainFloor6)}))
	}
	rules = append(rules, r.floorRules()...)
	for _, t := range []uint32{unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_MULTICAST} {
		rules = append(rules, cat(fibDaddrType(t), refuse))
	}
	// The policy decides new flows; established ones (and their related
	// ICMP errors) keep going when a reload changes it.
	rules = append(rules, cat(ctStateNone(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), []expr.Any{jump(chainPolicy)}))
	rules = append(rules, []expr.Any{jump(chainLimits)})
	rules = append(rules, r.blockLimitRules()...)
	return append(rules, []expr.Any{verdict(expr.VerdictAccept)})
}

// inputRules are the rules of the input base chain.
func (r ruleset) inputRules() [][]expr.Any {
	return [][]expr.Any{cat(iifname(expr.CmpOpEq, r.tun), []expr.Any{jump(chainToHost)})}
}

// toHostRules decide what a job may send to the gateway host itself: DNS
// and ping to the gateway's tunnel address, and what the policy allows
// explicitly (host_policy; never the tunnel address).
func (r ruleset) toHostRules() [][]expr.Any {
	gw := netip.PrefixFrom(r.addr.Addr(), 32)
	v4gw := cat(nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(false, expr.CmpOpEq, gw))
	accept := []expr.Any{verdict(expr.VerdictAccept)}
	echo := func(typ byte) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{typ}},
		}
	}
	rules := [][]expr.Any{
		cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept),
		cat(v4gw, l4proto(unix.IPPROTO_UDP), dport(53), accept),
		cat(v4gw, l4proto(unix.IPPROTO_TCP), dport(53), accept),
		cat(v4gw, l4proto(unix.IPPROTO_ICMP), echo(8), accept), // echo-request
	}
	if r.v6() {
		v6gw := cat(nfproto6(), ip6(false, expr.CmpOpEq, netip.PrefixFrom(r.addr6.Addr(), 128)))
		rules = append(rules,
			cat(v6gw, l4proto(unix.IPPROTO_UDP), dport(53), accept),
			cat(v6gw, l4proto(unix.IPPROTO_TCP), dport(53), accept),
			cat(v6gw, l4proto(unix.IPPROTO_ICMPV6), echo(128), accept)) // echo-request
	}
	// The floor's destinations the host takes in (multicast, broadcast)
	// are the floor's, not the host's.
	rules = append(rules, r.floorRules()...)
	return append(rules,
		[]expr.Any{jump(chainPolicyHost)},
		// What host_policy leaves: the tunnel addresses beyond DNS and
		// echo, i.e. the floor.
		[]expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainFloor}},
	)
}

// snat returns `snat ip to EGRESS[:LO-HI]`; a zero egress means the
// ruleset's.
func (r ruleset) snat(egress netip.Addr, block portblock.Range) []expr.Any {
	if !egress.IsValid() {
		egress = r.egress
	}
	e := []expr.Any{&expr.Immediate{Register: 1, Data: egress.AsSlice()}}
	n := &expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1}
	if egress.Is6() {
		n.Family = unix.NFPROTO_IPV6
	}
	if block.Len() > 0 && block.Lo != 0 {
		e = append(e,
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(block.Lo)},
			&expr.Immediate{Register: 3, Data: binaryutil.BigEndian.PutUint16(block.Hi)})
		n.RegProtoMin, n.RegProtoMax, n.Specified = 2, 3, true
	}
	return append(e, n)
}

// jobRules are the postrouting NAT rules of the job at addr: TCP and UDP to
// the job's egress address (zero: the ruleset's) and port block, everything
// else (ICMP echo) to the address alone. A zero block maps TCP and UDP to
// the address alone too.
func (r ruleset) jobRules(addr, egress netip.Addr, block portblock.Range) [][]expr.Any {
	match := cat(nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(true, expr.CmpOpEq, netip.PrefixFrom(addr, 32)), oifname(expr.CmpOpNeq, r.tun))
	return [][]expr.Any{
		cat(match, l4proto(unix.IPPROTO_TCP), r.snat(egress, block)),
		cat(match, l4proto(unix.IPPROTO_UDP), r.snat(egress, block)),
		cat(match, r.snat(egress, portblock.Range{})),
	}
}

// jobRules6 are the postrouting NAT rules of a job's IPv6 address addr6:
// with an own public address egress6 (own6), one address-only SNAT for
// every protocol (ports kept); else as jobRules, to egress6 (zero: the
// ruleset's egress6) and the block; without any IPv6 egress address,
// masquerade (the outgoing interface's address) to the block.
func (r ruleset) jobRules6(addr6, egress6 netip.Addr, block portblock.Range) [][]expr.Any {
	match := cat(nfproto6(), ip6(true, expr.CmpOpEq, netip.PrefixFrom(addr6, 128)), oifname(expr.CmpOpNeq, r.tun))
	if r.own6(egress6) {
		return [][]expr.Any{cat(match, r.snat(egress6, portblock.Range{}))}
	}
	if !egress6.IsValid() {
		egress6 = r.egress6
	}
	if !egress6.IsValid() {
		return [][]expr.Any{
			cat(match, l4proto(unix.IPPROTO_TCP), masq(block)),
			cat(match, l4proto(unix.IPPROTO_UDP), masq(block)),
			cat(match, masq(portblock.Range{})),
		}
	}
	return [][]expr.Any{
		cat(match, l4proto(unix.IPPROTO_TCP), r.snat(egress6, block)),
		cat(match, l4proto(unix.IPPROTO_UDP), r.snat(egress6, block)),
		cat(match, r.snat(egress6, portblock.Range{})),
	}
}

// own6 reports whether egress6 is a job's own public address: one in the
// routed --egress-prefix6.
func (r ruleset) own6(egress6 netip.Addr) bool {
	return egress6.IsValid() && r.prefix6.IsValid() && r.prefix6.Contains(egress6)
}

// masq returns `masquerade [to :LO-HI]`.
func masq(block portblock.Range) []expr.Any {
	if block.Len() == 0 || block.Lo == 0 {
		return []expr.Any{&expr.Masq{}}
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(block.Lo)},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(block.Hi)},
		&expr.Masq{ToPorts: true, RegProtoMin: 1, RegProtoMax: 2},
	}
}

// exposeRules6 are the prerouting DNAT rules of a job's IPv6 exposures
// (those whose PublicAddr is IPv6): `ip6 daddr PUBLIC PROTO dport PUBPORT
// dnat ip6 to [JOB6]:PORT`. For a job with an own public address
// (own), the public port is the job's own port: nothing is translated but
// the address.
func (r ruleset) exposeRules6(addr6 netip.Addr, own bool, ex []forward.Exposure) ([][]expr.Any, error) {
	var dnat [][]expr.Any
	for _, x := range ex {
		proto, err := exposeProto(x)
		if err != nil {
			return nil, err
		}
		pub := x.PublicPort
		if own {
			pub = x.JobPort
		}
		dnat = append(dnat, cat(
			nfproto6(),
			iifname(expr.CmpOpNeq, r.tun),
			ip6(false, expr.CmpOpEq, netip.PrefixFrom(x.PublicAddr, 128)),
			l4proto(proto), dport(pub),
			[]expr.Any{
				&expr.Immediate{Register: 1, Data: addr6.AsSlice()},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(x.JobPort)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6,
					RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true},
			}))
	}
	return dnat, nil
}

// exposeProto checks an exposure and returns its IP protocol number.
func exposeProto(x forward.Exposure) (byte, error) {
	var proto byte
	switch x.Proto {
	case ipproto.TCP:
		proto = unix.IPPROTO_TCP
	case ipproto.UDP:
		proto = unix.IPPROTO_UDP
	default:
		return 0, fmt.Errorf("kernel egress: expose %d/%s: want tcp or udp", x.JobPort, x.Proto)
	}
	if x.JobPort == 0 || x.PublicPort == 0 {
		return 0, fmt.Errorf("kernel egress: expose %d/%s at port %d: port 0", x.JobPort, x.Proto, x.PublicPort)
	}
	return proto, nil
}

// exposeRules are the prerouting DNAT rules of the job at addr, one per
// exposure: `iifname != TUN ip daddr EGRESS PROTO dport PUBPORT dnat ip to
// JOB:PORT`.
func (r ruleset) exposeRules(addr netip.Addr, ex []forward.Exposure) ([][]expr.Any, error) {
	var rules [][]expr.Any
	for _, x := range ex {
		proto, err := exposeProto(x)
		if err != nil {
			return nil, err
		}
		job := addr.As4()
		at := r.egress
		if x.PublicAddr.IsValid() {
			at = x.PublicAddr
		}
		rules = append(rules, cat(
			nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4),
			iifname(expr.CmpOpNeq, r.tun),
			ip4(false, expr.CmpOpEq, netip.PrefixFrom(at, 32)),
			l4proto(proto), dport(x.PublicPort),
			[]expr.Any{
				&expr.Immediate{Register: 1, Data: job[:]},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(x.JobPort)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4,
					RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true},
			}))
	}
	return rules, nil
}

// exposeTag marks the DNAT rules of the job at addr.
func exposeTag(addr netip.Addr) []byte { return []byte(exposeTagPrefix + addr.String()) }

// preChain returns the prerouting NAT chain that holds exposures' DNAT
// rules.
func preChain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: chainPre, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest}
}

// jobTag is the user data that marks a job's rules, so that their handles
// can be found after they are added.
func jobTag(addr netip.Addr) []byte { return []byte(jobTagPrefix + addr.String()) }

// jobTag6 marks the IPv6 NAT rules of the job at addr (its IPv4 address).
func jobTag6(addr netip.Addr) []byte { return []byte(jobTagPrefix + "ipv6 " + addr.String()) }

// stateTag records a forwarding sysctl's value to restore: prefix is
// stateTagPrefix (ip_forward) or stateTagPref6 (IPv6 forwarding).
func stateTag(prefix, v string) []byte { return []byte(prefix + v) }

// parseStateTag returns the remembered value of a state rule with prefix.
func parseStateTag(b []byte, prefix string) (string, bool) {
	s, ok := strings.CutPrefix(string(b), prefix)
	if !ok {
		return "", false
	}
	if _, err := strconv.Atoi(s); err != nil {
		return "", false
	}
	return s, true
}

// table returns Airlock's table.
func table() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
}

// chains returns the table's chains.
func chains(t *nftables.Table) (post, fwd, fromJobs, input, toHost, state, refuse *nftables.Chain) {
	accept := nftables.ChainPolicyAccept
	post = &nftables.Chain{Name: chainPost, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource}
	fwd = &nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	fromJobs = &nftables.Chain{Name: chainFromJobs, Table: t}
	input = &nftables.Chain{Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept}
	toHost = &nftables.Chain{Name: chainToHost, Table: t}
	state = &nftables.Chain{Name: chainState, Table: t}
	refuse = &nftables.Chain{Name: chainRefuse, Table: t}
	return
}

// floor6Chain returns the chain of the IPv6 floor.
func floor6Chain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: chainFloor6, Table: t}
}

// validate checks the ruleset's inputs.
func (r ruleset) validate() error {
	if !r.addr.IsValid() || !r.addr.Addr().Is4() {
		return fmt.Errorf("kernel egress: tunnel address %v: want an IPv4 address/prefix", r.addr)
	}
	if !r.egress.IsValid() || !r.egress.Is4() || r.egress.IsUnspecified() {
		return fmt.Errorf("kernel egress: egress address %v: want the gateway's public IPv4 address (--egress-addr)", r.egress)
	}
	if r.addr6.IsValid() && (!r.addr6.Addr().Is6() || r.addr6.Addr().Is4In6() || r.addr6.Bits() > 126) {
		return fmt.Errorf("kernel egress: IPv6 tunnel address %v: want an IPv6 address/prefix of at most /126", r.addr6)
	}
	if r.egress6.IsValid() && (!r.egress6.Is6() || r.egress6.Is4In6() || r.egress6.IsUnspecified()) {
		return fmt.Errorf("kernel egress: IPv6 egress address %v: want a unicast IPv6 address", r.egress6)
	}
	if r.prefix6.IsValid() {
		if !r.addr6.IsValid() {
			return fmt.Errorf("kernel egress: --egress-prefix6 %v without an IPv6 tunnel address", r.prefix6)
		}
		if !r.prefix6.Addr().Is6() || r.prefix6.Addr().Is4In6() || r.prefix6.Bits() > 128 || r.prefix6.Overlaps(r.addr6) {
			return fmt.Errorf("kernel egress: --egress-prefix6 %v: want an IPv6 prefix apart from the tunnel subnet %v", r.prefix6, r.addr6.Masked())
		}
	}
	if r.tun == "" || len(r.tun) >= unix.IFNAMSIZ {
		return fmt.Errorf("kernel egress: interface name %q: want 1-%d characters", r.tun, unix.IFNAMSIZ-1)
	}
	return nil
}
