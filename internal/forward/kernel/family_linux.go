// SPDX-License-Identifier: MIT

package kernel

import (
	"bytes"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// nftFamily is kernel mode's row of the family table (internal/ipfamily):
// what nftables, netlink, tc and the forwarding sysctls call the family.
// Rules are built once for every family the ruleset forwards from these
// rows; only the IPv6 floor and policy (embed_linux.go), whose
// IPv4-embedding images have no IPv4 counterpart, are IPv6's alone.
type nftFamily struct {
	*ipfamily.Family
	// nfproto is NFPROTO_IPV4 or NFPROTO_IPV6 (meta nfproto, nat family).
	nfproto byte
	// addrType is an address's nftables set key type.
	addrType nftables.SetDatatype
	// conns is the block limit's set (connsSet).
	conns string
	// scope is the name prefix of the policy's token scope sets.
	scope string
	// netlink is the address family of netlink (conntrack) calls.
	netlink netlink.InetFamily
	// ethProto is the tc filter protocol; tcPrio is added to a limited
	// job's class minor for the priority of its filter of the family
	// (filters of one priority share a protocol).
	ethProto uint16
	tcPrio   uint16
	// forwarding is the sysctl that makes the host route the family
	// between the TUN and its other interfaces (per network namespace);
	// stateTag the user data prefix that remembers its value in the
	// table's state chain.
	forwarding, stateTag string
}

// The kernel mode's family table, by ipfamily.Family.Index.
var (
	v4Family = &nftFamily{Family: ipfamily.V4, nfproto: unix.NFPROTO_IPV4, addrType: nftables.TypeIPAddr,
		conns: "conns", scope: "scope", netlink: unix.AF_INET, ethProto: unix.ETH_P_IP, tcPrio: 0,
		forwarding: "/proc/sys/net/ipv4/ip_forward", stateTag: "airlock ip_forward="}
	v6Family = &nftFamily{Family: ipfamily.V6, nfproto: unix.NFPROTO_IPV6, addrType: nftables.TypeIP6Addr,
		conns: "conns6", scope: "scope6_", netlink: unix.AF_INET6, ethProto: unix.ETH_P_IPV6, tcPrio: prio6,
		forwarding: "/proc/sys/net/ipv6/conf/all/forwarding", stateTag: "airlock ipv6_forwarding="}
	nftFamilies = [ipfamily.N]*nftFamily{v4Family, v6Family}
)

// famOf returns the row of a's family; a must be valid.
func famOf(a netip.Addr) *nftFamily { return nftFamilies[ipfamily.Of(a).Index] }

// match matches the family's packets (meta nfproto).
func (f *nftFamily) match() []expr.Any { return nfproto(expr.CmpOpEq, f.nfproto) }

// maskedMatch matches the source (src) or destination address of the
// family's packets whose bits under mask equal val (op CmpOpEq; CmpOpNeq:
// differ): a load, an and unless the loaded bytes' mask is all ones, a
// compare. As nft encodes a prefix, a prefix of whole bytes loads only
// those bytes, and any other mask only the bytes from its first non-zero
// one to its last: that keeps rules small (the kernel refuses a rule of
// 4 KiB of expressions, and an IPv6 allow rule of everything cuts out
// dozens of ranges) while `nft list` still shows prefixes as such.
func maskedMatch(f *nftFamily, src bool, op expr.CmpOp, val, mask []byte) []expr.Any {
	off := f.DstOff
	if src {
		off = f.SrcOff
	}
	lo, hi := span(mask)
	n := uint32(hi - lo)
	e := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: uint32(off + lo), Len: n}}
	if !bytes.Equal(mask[lo:hi], bytes.Repeat([]byte{0xff}, int(n))) {
		e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: bytes.Clone(mask[lo:hi]), Xor: make([]byte, n)})
	}
	return append(e, &expr.Cmp{Op: op, Register: 1, Data: bytes.Clone(val[lo:hi])})
}

// span returns the bytes [lo, hi) of an address that maskedMatch loads
// for mask (never none).
func span(mask []byte) (lo, hi int) {
	ones := 0 // the prefix length, if mask is a prefix's
	for ones < 8*len(mask) && mask[ones/8]&(0x80>>(ones%8)) != 0 {
		ones++
	}
	prefix := true
	for i := ones; i < 8*len(mask); i++ {
		prefix = prefix && mask[i/8]&(0x80>>(i%8)) == 0
	}
	switch {
	case prefix && ones%8 == 0 && ones > 0:
		return 0, ones / 8
	case prefix:
		return 0, len(mask)
	}
	lo, hi = 0, len(mask)
	for mask[lo] == 0 {
		lo++
	}
	for mask[hi-1] == 0 {
		hi--
	}
	return lo, hi
}

// addrMatch matches the source (src) or destination address against
// prefix p, of p's family. The caller must have matched the family
// (nftFamily.match) first.
func addrMatch(src bool, op expr.CmpOp, p netip.Prefix) []expr.Any {
	f := famOf(p.Addr())
	n := f.Bits / 8
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 1 << (7 - i%8)
	}
	return maskedMatch(f, src, op, p.Masked().Addr().Unmap().AsSlice(), mask)
}
