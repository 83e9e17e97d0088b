// SPDX-License-Identifier: MIT

// Package ipfamily is the table of IP address families: what differs
// between IPv4 and IPv6 where Airlock reads or writes packets and
// addresses (the fixed header's length, where its addresses and its
// protocol field are, the ICMP protocol and its echo types, the unspecified
// address). Code that handles both families looks its differences up here
// (Of an address, OfPacket of a packet) instead of being written twice, as
// gVisor drives its network layer from a protocol-number table; per-family
// state of other packages is an array indexed by Family.Index.
package ipfamily

import (
	"encoding/binary"
	"net/netip"
)

// Family is one address family's row of the table. Rows are values shared
// by everyone: never modify them.
type Family struct {
	// Index is the row's position in All (0 IPv4, 1 IPv6), for arrays of
	// per-family state.
	Index int
	// Name is "IPv4" or "IPv6".
	Name string
	// Version is the IP version, the first nibble of a packet.
	Version uint8
	// Bits is the address length in bits.
	Bits int
	// HeaderLen is the length of the fixed header; IPv4's options come
	// after it (its IHL says how many), IPv6's extension headers too.
	HeaderLen int
	// SrcOff and DstOff are the offsets of the source and destination
	// addresses in the header.
	SrcOff, DstOff int
	// ProtoOff is the offset of the protocol field (IPv6: the fixed
	// header's next header).
	ProtoOff int
	// ICMP is the IANA number of the family's ICMP (1, 58).
	ICMP uint8
	// EchoRequest and EchoReply are ICMP's echo types.
	EchoRequest, EchoReply uint8
	// Unspecified is the family's unspecified address.
	Unspecified netip.Addr
	// All is the prefix of every address of the family.
	All netip.Prefix
}

// The table.
var (
	V4 = &Family{Index: 0, Name: "IPv4", Version: 4, Bits: 32, HeaderLen: 20, SrcOff: 12, DstOff: 16, ProtoOff: 9,
		ICMP: 1, EchoRequest: 8, EchoReply: 0,
		Unspecified: netip.IPv4Unspecified(), All: netip.PrefixFrom(netip.IPv4Unspecified(), 0)}
	V6 = &Family{Index: 1, Name: "IPv6", Version: 6, Bits: 128, HeaderLen: 40, SrcOff: 8, DstOff: 24, ProtoOff: 6,
		ICMP: 58, EchoRequest: 128, EchoReply: 129,
		Unspecified: netip.IPv6Unspecified(), All: netip.PrefixFrom(netip.IPv6Unspecified(), 0)}
)

// N is the number of families.
const N = 2

// All lists the families by Index.
var All = [N]*Family{V4, V6}

// Of returns the family of a (an IPv4-mapped IPv6 address is IPv4); nil
// for the zero Addr.
func Of(a netip.Addr) *Family {
	switch {
	case !a.IsValid():
		return nil
	case a.Unmap().Is4():
		return V4
	}
	return V6
}

// OfPacket returns the family of the IP packet p by its version nibble,
// nil if p is empty or neither IPv4 nor IPv6. It checks no length:
// HeaderLen says how much a header needs.
func OfPacket(p []byte) *Family {
	if len(p) == 0 {
		return nil
	}
	switch p[0] >> 4 {
	case 4:
		return V4
	case 6:
		return V6
	}
	return nil
}

// Addr returns the address of the family at p[off:] (SrcOff, DstOff); p
// must hold it.
func (f *Family) Addr(p []byte, off int) netip.Addr {
	if f.Bits == 32 {
		return netip.AddrFrom4([4]byte(p[off : off+4]))
	}
	return netip.AddrFrom16([16]byte(p[off : off+16]))
}

// Contains reports whether a is an address of the family (an
// IPv4-mapped IPv6 address is IPv4).
func (f *Family) Contains(a netip.Addr) bool { return Of(a) == f }

// PayloadOffset returns where the transport header of packet p of the
// family starts and its protocol, or ok false if p is too short, is a
// fragment other than the first, or (IPv6) carries extension headers
// before its transport header.
func (f *Family) PayloadOffset(p []byte) (off int, proto uint8, ok bool) {
	if len(p) < f.HeaderLen {
		return 0, 0, false
	}
	if f.Version == 4 {
		ihl := int(p[0]&0x0f) * 4
		if ihl < f.HeaderLen || len(p) < ihl || binary.BigEndian.Uint16(p[6:8])&0x1fff != 0 {
			return 0, 0, false
		}
		return ihl, p[f.ProtoOff], true
	}
	switch nh := p[f.ProtoOff]; nh {
	case 0, 43, 44, 50, 51, 60, 135, 139, 140: // extension headers (RFC 8200 and after)
		return 0, 0, false
	default:
		return f.HeaderLen, nh, true
	}
}

func (f *Family) String() string { return f.Name }
