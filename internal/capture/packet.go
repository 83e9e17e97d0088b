// SPDX-License-Identifier: MIT

package capture

import (
	"encoding/binary"
	"net/netip"
)

// IP protocol numbers the filter knows.
const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
)

// packet is what the filter and the selection look at: the addresses,
// protocol and ports of one IP packet, and its direction.
type packet struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
	// ports reports that sport and dport are set (TCP or UDP, first
	// fragment).
	ports bool
	// out reports a packet sent by a job (the job is src), else one to
	// a job (the job is dst).
	out bool
}

// job is the address of the packet's job.
func (p *packet) job() netip.Addr {
	if p.out {
		return p.src
	}
	return p.dst
}

// remote is the packet's address and port on the side away from the job.
func (p *packet) remote() (netip.Addr, uint16) {
	if p.out {
		return p.dst, p.dport
	}
	return p.src, p.sport
}

// parse fills p from the IP packet b; false if b is not a whole IPv4 or
// IPv6 header. It allocates nothing.
func (p *packet) parse(b []byte, out bool) bool {
	*p = packet{out: out}
	if len(b) < 1 {
		return false
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return false
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl {
			return false
		}
		p.src = netip.AddrFrom4([4]byte(b[12:16]))
		p.dst = netip.AddrFrom4([4]byte(b[16:20]))
		p.proto = b[9]
		if binary.BigEndian.Uint16(b[6:8])&0x1fff == 0 {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return false
		}
		p.src = netip.AddrFrom16([16]byte(b[8:24]))
		p.dst = netip.AddrFrom16([16]byte(b[24:40]))
		p.proto = b[6] // extension headers are not followed
		l4 = b[40:]
	default:
		return false
	}
	if (p.proto == protoTCP || p.proto == protoUDP) && len(l4) >= 4 {
		p.sport = binary.BigEndian.Uint16(l4[0:2])
		p.dport = binary.BigEndian.Uint16(l4[2:4])
		p.ports = true
	}
	return true
}
