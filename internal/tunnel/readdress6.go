// SPDX-License-Identifier: MIT

package tunnel

import (
	"encoding/binary"
	"net/netip"
)

// addrMap6 is Readdress's IPv6 mapping: the job's IPv6 address ↔ the
// lease's, and the job's IPv6 resolver ↔ the current gateway's.
type addrMap6 struct {
	job, lease     [16]byte
	jobDNS, gwDNS  [16]byte
	rewriteDNS     bool
	rewriteAddress bool
}

// SetIPv6 is Set for a dual-stack job's IPv6 side: the job's IPv6 address
// job appears outside as lease, its IPv6 resolver jobDNS as gwDNS. Equal
// pairs, or invalid addresses (an IPv4-only job or lease), turn it off.
// Packets whose transport header follows IPv6 extension headers are
// passed untouched.
func (r *Readdress) SetIPv6(job, lease, jobDNS, gwDNS netip.Addr) {
	six := func(a, b netip.Addr) bool { return a != b && a.Is6() && b.Is6() && !a.Is4In6() && !b.Is4In6() }
	if !six(job, lease) && !six(jobDNS, gwDNS) {
		r.m6.Store(nil)
		return
	}
	m := &addrMap6{}
	if six(job, lease) {
		m.job, m.lease, m.rewriteAddress = job.As16(), lease.As16(), true
	}
	if six(jobDNS, gwDNS) {
		m.jobDNS, m.gwDNS, m.rewriteDNS = jobDNS.As16(), gwDNS.As16(), true
	}
	r.m6.Store(m)
}

// out rewrites a packet from the job.
func (m *addrMap6) out(p []byte) {
	if m.rewriteAddress {
		rewriteIPv6(p, 8, m.job, m.lease)
	}
	if m.rewriteDNS {
		rewriteIPv6(p, 24, m.jobDNS, m.gwDNS)
	}
}

// in rewrites a packet to the job.
func (m *addrMap6) in(p []byte) {
	if m.rewriteAddress {
		rewriteIPv6(p, 24, m.lease, m.job)
	}
	if m.rewriteDNS {
		rewriteIPv6(p, 8, m.gwDNS, m.jobDNS)
	}
}

// rewriteIPv6 replaces the IPv6 address at byte at (8: source, 24:
// destination) of packet p by to if it is from, and fixes the TCP, UDP or
// ICMPv6 checksum that follows the fixed header (all three cover the
// addresses through the pseudo-header).
func rewriteIPv6(p []byte, at int, from, to [16]byte) {
	const hdr = 40
	if len(p) < hdr || p[0]>>4 != 6 || [16]byte(p[at:at+16]) != from {
		return
	}
	copy(p[at:at+16], to[:])
	l4 := p[hdr:]
	switch p[6] {
	case 6: // TCP
		if len(l4) >= 18 {
			fixChecksumN(l4[16:18], from[:], to[:])
		}
	case 17: // UDP: the checksum is mandatory in IPv6
		if len(l4) >= 8 {
			fixChecksumN(l4[6:8], from[:], to[:])
			if l4[6] == 0 && l4[7] == 0 {
				l4[6], l4[7] = 0xff, 0xff
			}
		}
	case 58: // ICMPv6
		if len(l4) >= 4 {
			fixChecksumN(l4[2:4], from[:], to[:])
		}
	}
}

// fixChecksumN is fixChecksum for a change of len(old) (even) bytes.
func fixChecksumN(c, old, new []byte) {
	sum := uint32(^binary.BigEndian.Uint16(c))
	for i := 0; i+1 < len(old); i += 2 {
		sum += uint32(^binary.BigEndian.Uint16(old[i:]) & 0xffff)
		sum += uint32(binary.BigEndian.Uint16(new[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(c, ^uint16(sum))
}
