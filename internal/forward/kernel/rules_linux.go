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
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
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
	return append(out, r.tunnels[ipfamily.V4.Index].Masked())
}

// ruleset describes the table for one forwarder: everything the rules
// depend on. Its methods build expressions only; they touch no kernel
// state, so they are testable without privileges.
type ruleset struct {
	tun string // TUN interface name
	// tunnels are the gateway's tunnel addresses with the subnets'
	// lengths, by family; IPv4's is required, IPv6's zero means no IPv6
	// (from_jobs drops it).
	tunnels [ipfamily.N]netip.Prefix
	// egress are the public source addresses of SNAT by family; IPv4's
	// is required, IPv6's zero means masquerade (the outgoing
	// interface's address).
	egress [ipfamily.N]netip.Addr
	// own is the routed prefix (IPv6) that jobs' own public addresses
	// come from (--egress-prefix); the zero Prefix means none.
	own netip.Prefix
	// blockSize is the number of ports in every job's block; 0 means no
	// per-destination connection limit.
	blockSize uint32
}

// has reports whether the ruleset forwards family f.
func (r ruleset) has(f *ipfamily.Family) bool { return r.tunnels[f.Index].IsValid() }

// families returns the families the ruleset forwards, IPv4 first.
func (r ruleset) families() []*nftFamily {
	var out []*nftFamily
	for _, f := range nftFamilies {
		if r.has(f.Family) {
			out = append(out, f)
		}
	}
	return out
}

// connsSet is the dynamic set of family f behind the per-destination
// connection limit: each job's connections per destination (job address .
// destination address . destination port), as a job's port block holds at
// most one connection per port to one destination.
func connsSet(t *nftables.Table, f *nftFamily) *nftables.Set {
	return &nftables.Set{
		Table:         t,
		Name:          f.conns,
		KeyType:       nftables.MustConcatSetType(f.addrType, f.addrType, nftables.TypeInetService),
		Dynamic:       true,
		Concatenation: true,
	}
}

// ownSet holds the tunnel addresses of the jobs with an own public
// address (IPv6, --egress-prefix): they have no port block, so the block
// limit does not apply.
func ownSet(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: setOwn, KeyType: nftables.TypeIP6Addr}
}

// blockLimitRules refuse a job's new TCP or UDP flow to a destination that
// already has as many of the job's flows as its block has ports: SNAT would
// find no free source port and the kernel would drop the packet silently,
// leaving the job to time out. `ct state new meta l4proto P add @conns
// { ip saddr . ip daddr . P dport ct count over N } goto refuse`, and the
// same with ip6 in @conns6, except for the jobs with an own address.
func (r ruleset) blockLimitRules() [][]expr.Any {
	if r.blockSize == 0 {
		return nil
	}
	var rules [][]expr.Any
	for _, f := range r.families() {
		// A concatenated key fills consecutive 32-bit registers from 8
		// (the first 16-byte register, 1): saddr from 8, daddr and the
		// port after it.
		n := uint32(f.Bits / 8)
		daddrReg := 8 + n/4
		var skip []expr.Any
		if f.Family == ipfamily.V6 {
			skip = []expr.Any{ // jobs with an own address keep their ports: no block
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: uint32(f.SrcOff), Len: n},
				&expr.Lookup{SourceRegister: 1, SetName: setOwn, Invert: true},
			}
		}
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			rules = append(rules, cat(f.match(), ctState(expr.CtStateBitNEW), l4proto(proto), skip, []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: uint32(f.SrcOff), Len: n},
				&expr.Payload{DestRegister: daddrReg, Base: expr.PayloadBaseNetworkHeader, Offset: uint32(f.DstOff), Len: n},
				&expr.Payload{DestRegister: daddrReg + n/4, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Dynset{
					SrcRegKey: 1,
					SetName:   f.conns,
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
	if r.has(ipfamily.V6) {
		// IPv6 link-local destinations are on-link on the TUN, so the
		// host routes them back into it: the policy decides them (and
		// counts the denial under its rule, builtin-link-local unless a
		// rule says otherwise); what it allows is refused by the floor
		// below like any job-to-job packet.
		rules = append(rules, cat(iifname(expr.CmpOpEq, r.tun), oifname(expr.CmpOpEq, r.tun), v6Family.match(),
			addrMatch(false, expr.CmpOpEq, netip.MustParsePrefix("fe80::/10")),
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
		rules = append(rules, cat(v4Family.match(), addrMatch(false, expr.CmpOpEq, p), floor))
	}
	return rules
}

// fromJobsRules are the safety floor for traffic from jobs to the outside,
// then the jobs' flow limits (limits_linux.go) and the block limit.
func (r ruleset) fromJobsRules() [][]expr.Any {
	drop := []expr.Any{verdict(expr.VerdictDrop)}
	refuse := []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainRefuse}}
	var rules [][]expr.Any
	for _, f := range r.families() {
		// Only the tunnel subnet's sources: a job cannot spoof.
		rules = append(rules, cat(f.match(), addrMatch(true, expr.CmpOpNeq, r.tunnels[f.Index].Masked()), drop))
	}
	if !r.has(ipfamily.V6) {
		rules = append(rules, cat(nfproto(expr.CmpOpNeq, unix.NFPROTO_IPV4), drop))
	} else {
		rules = append(rules,
			// The IPv6 floor is long: new flows only.
			cat(v6Family.match(), ctStateNone(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), []expr.Any{jump(chainFloor6)}))
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
// and ping to the gateway's tunnel addresses, and what the policy allows
// explicitly (host_policy; never the tunnel addresses).
func (r ruleset) toHostRules() [][]expr.Any {
	accept := []expr.Any{verdict(expr.VerdictAccept)}
	rules := [][]expr.Any{cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)}
	for _, f := range r.families() {
		gw := cat(f.match(), addrMatch(false, expr.CmpOpEq, netip.PrefixFrom(r.tunnels[f.Index].Addr(), f.Bits)))
		echo := []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.EchoRequest}},
		}
		rules = append(rules,
			cat(gw, l4proto(unix.IPPROTO_UDP), dport(53), accept),
			cat(gw, l4proto(unix.IPPROTO_TCP), dport(53), accept),
			cat(gw, l4proto(f.ICMP), echo, accept))
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

// jobEgress is where a job's flows of one family leave from, resolved
// against the ruleset: addr (zero only for IPv6 without a configured
// egress address: masquerade), block (zero: any port, no translation of
// ports with own), own (addr is the job's own address).
type jobEgress struct {
	addr  netip.Addr
	block portblock.Range
	own   bool
}

// egressOf returns the job's egress of family f: its entry of f (an
// unspecified address is the ruleset's egress address of f), or the
// ruleset's address with any port.
func (r ruleset) egressOf(j forward.Job, f *nftFamily) jobEgress {
	e, _ := j.EgressOf(f.Family)
	if !e.Addr.IsValid() || e.Addr.IsUnspecified() {
		e.Addr = r.egress[f.Index]
	}
	return jobEgress{addr: e.Addr.Unmap(), block: e.Block, own: e.Own}
}

// snat returns `snat ip|ip6 to EGRESS[:LO-HI]`.
func snat(egress netip.Addr, block portblock.Range) []expr.Any {
	e := []expr.Any{&expr.Immediate{Register: 1, Data: egress.AsSlice()}}
	n := &expr.NAT{Type: expr.NATTypeSourceNAT, Family: uint32(famOf(egress).nfproto), RegAddrMin: 1, RegAddrMax: 1}
	if block.Len() > 0 && block.Lo != 0 {
		e = append(e,
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(block.Lo)},
			&expr.Immediate{Register: 3, Data: binaryutil.BigEndian.PutUint16(block.Hi)})
		n.RegProtoMin, n.RegProtoMax, n.Specified = 2, 3, true
	}
	return append(e, n)
}

// natRules are the postrouting NAT rules of a job's tunnel address addr
// leaving from e: with an own address, one address-only SNAT for every
// protocol (ports kept); else TCP and UDP to the egress address and port
// block, everything else (ICMP echo) to the address alone (a zero block
// maps TCP and UDP to the address alone too); without an egress address
// (IPv6 only), masquerade (the outgoing interface's address) to the block.
func (r ruleset) natRules(addr netip.Addr, e jobEgress) [][]expr.Any {
	f := famOf(addr)
	match := cat(f.match(), addrMatch(true, expr.CmpOpEq, netip.PrefixFrom(addr, f.Bits)), oifname(expr.CmpOpNeq, r.tun))
	to := func(b portblock.Range) []expr.Any { return snat(e.addr, b) }
	switch {
	case e.own:
		return [][]expr.Any{cat(match, snat(e.addr, portblock.Range{}))}
	case !e.addr.IsValid():
		to = masq
	}
	return [][]expr.Any{
		cat(match, l4proto(unix.IPPROTO_TCP), to(e.block)),
		cat(match, l4proto(unix.IPPROTO_UDP), to(e.block)),
		cat(match, to(portblock.Range{})),
	}
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

// exposeRules are the prerouting DNAT rules of job j, one per exposure,
// to the job's tunnel address of the exposure's family: `iifname != TUN
// ip|ip6 daddr PUBLIC PROTO dport PUBPORT dnat ip|ip6 to JOB:PORT`. An
// unspecified public address is the ruleset's egress address of its
// family. (At a job's own address the gateway gives the job's own port as
// the public port: only the address is translated.)
func (r ruleset) exposeRules(j forward.Job, ex []forward.Exposure) ([][]expr.Any, error) {
	var rules [][]expr.Any
	for _, x := range ex {
		proto, err := exposeProto(x)
		if err != nil {
			return nil, err
		}
		f := famOf(x.PublicAddr)
		job, ok := j.AddrOf(f.Family)
		if !ok {
			return nil, fmt.Errorf("kernel egress: expose %d/%s at %v: the job has no %s tunnel address", x.JobPort, x.Proto, x.PublicAddr, f)
		}
		at := x.PublicAddr.Unmap()
		if at.IsUnspecified() {
			at = r.egress[f.Index]
		}
		if !at.IsValid() {
			return nil, fmt.Errorf("kernel egress: expose %d/%s: no %s egress address", x.JobPort, x.Proto, f)
		}
		rules = append(rules, cat(
			f.match(),
			iifname(expr.CmpOpNeq, r.tun),
			addrMatch(false, expr.CmpOpEq, netip.PrefixFrom(at, f.Bits)),
			l4proto(proto), dport(x.PublicPort),
			[]expr.Any{
				&expr.Immediate{Register: 1, Data: job.AsSlice()},
				&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(x.JobPort)},
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.nfproto),
					RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true},
			}))
	}
	return rules, nil
}

// exposeTag marks the DNAT rules of job id.
func exposeTag(id jobs.ID) []byte { return []byte(exposeTagPrefix + string(id)) }

// jobTag is the user data that marks a job's NAT rules (of all its
// addresses), so that their handles can be found after they are added.
func jobTag(id jobs.ID) []byte { return []byte(jobTagPrefix + string(id)) }

// stateTag records a forwarding sysctl's value to restore: prefix is the
// family's nftFamily.stateTag.
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

// tableChains are the table's chains (the policy's are policyChains;
// the floor's is floorChain). floor6 holds the IPv6 destinations of the
// safety floor (embed_linux.go), which only IPv6 has a chain for: the
// IPv4 ones are rules of from_jobs (floorRules). Both go to the floor
// chain.
type tableChains struct {
	post, pre, fwd, fromJobs, input, toHost, state, refuse, floor6 *nftables.Chain
	limits, overFlows, overRate                                    *nftables.Chain
}

// chainsOf returns the chains of table t.
func chainsOf(t *nftables.Table) tableChains {
	accept := nftables.ChainPolicyAccept
	c := tableChains{
		post: &nftables.Chain{Name: chainPost, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource},
		pre: &nftables.Chain{Name: chainPre, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
		fwd: &nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		fromJobs: &nftables.Chain{Name: chainFromJobs, Table: t},
		input: &nftables.Chain{Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept},
		toHost: &nftables.Chain{Name: chainToHost, Table: t},
		state:  &nftables.Chain{Name: chainState, Table: t},
		refuse: &nftables.Chain{Name: chainRefuse, Table: t},
		floor6: &nftables.Chain{Name: chainFloor6, Table: t},
	}
	c.limits, c.overFlows, c.overRate = limitChains(t)
	return c
}

// validate checks the ruleset's inputs.
func (r ruleset) validate() error {
	v4, v6 := ipfamily.V4.Index, ipfamily.V6.Index
	if !r.tunnels[v4].IsValid() {
		return fmt.Errorf("kernel egress: tunnel addresses %v: want an IPv4 address/prefix", r.tunnels)
	}
	for _, f := range nftFamilies {
		p, e := r.tunnels[f.Index], r.egress[f.Index]
		if p.IsValid() && (!f.Contains(p.Addr()) || p.Addr().Is4In6() || p.Bits() > f.Bits-2) {
			return fmt.Errorf("kernel egress: %s tunnel address %v: want an %s address/prefix of at most /%d", f, p, f, f.Bits-2)
		}
		if e.IsValid() && (!f.Contains(e) || e.Is4In6() || e.IsUnspecified() || e.IsMulticast()) {
			return fmt.Errorf("kernel egress: %s egress address %v: want a unicast %s address", f, e, f)
		}
	}
	if !r.egress[v4].IsValid() {
		return fmt.Errorf("kernel egress: egress address %v: want the gateway's public IPv4 address (--egress-addr)", r.egress[v4])
	}
	if r.own.IsValid() {
		if !r.tunnels[v6].IsValid() {
			return fmt.Errorf("kernel egress: --egress-prefix %v without an IPv6 tunnel address", r.own)
		}
		if !r.own.Addr().Is6() || r.own.Addr().Is4In6() || r.own.Overlaps(r.tunnels[v6]) {
			return fmt.Errorf("kernel egress: --egress-prefix %v: want an IPv6 prefix apart from the tunnel subnet %v", r.own, r.tunnels[v6].Masked())
		}
	}
	if r.tun == "" || len(r.tun) >= unix.IFNAMSIZ {
		return fmt.Errorf("kernel egress: interface name %q: want 1-%d characters", r.tun, unix.IFNAMSIZ-1)
	}
	return nil
}
