// SPDX-License-Identifier: MIT

package tunnel

import (
	"encoding/binary"
	"net/netip"
	"sync/atomic"

	"golang.zx2c4.com/wireguard/tun"
)

// Readdress is a tun.Device decorator that lets a job keep the tunnel
// address it started with when its lease changes to another address (a
// new lease after its old one was lost, or another gateway with another
// subnet): packets the job sends have their source rewritten from the job's
// address to the lease's, and their destination from the job's DNS server to
// the gateway's; packets to the job get the reverse. IPv4 here, IPv6 with
// SetIPv6 (readdress6.go); header, TCP, UDP (and ICMPv6) checksums are
// updated incrementally (RFC 1624). Until Set is
// called with two different mappings it passes packets through untouched.
// It is safe for concurrent use.
type Readdress struct {
	tun.Device
	m  atomic.Pointer[addrMap]
	m6 atomic.Pointer[addrMap6] // readdress6.go
}

type addrMap struct {
	job, lease     [4]byte // job's own address ↔ lease address
	jobDNS, gwDNS  [4]byte // job's resolver ↔ the current gateway's
	rewriteDNS     bool
	rewriteAddress bool
}

// NewReaddress wraps dev.
func NewReaddress(dev tun.Device) *Readdress { return &Readdress{Device: dev} }

// Set makes the job's address job appear outside as lease and the job's DNS
// server jobDNS as gwDNS. Equal pairs turn the rewriting off.
func (r *Readdress) Set(job, lease, jobDNS, gwDNS netip.Addr) {
	if (job == lease || !job.Is4() || !lease.Is4()) && (jobDNS == gwDNS || !jobDNS.Is4() || !gwDNS.Is4()) {
		r.m.Store(nil)
		return
	}
	m := &addrMap{}
	if job != lease && job.Is4() && lease.Is4() {
		m.job, m.lease, m.rewriteAddress = job.As4(), lease.As4(), true
	}
	if jobDNS != gwDNS && jobDNS.Is4() && gwDNS.Is4() {
		m.jobDNS, m.gwDNS, m.rewriteDNS = jobDNS.As4(), gwDNS.As4(), true
	}
	r.m.Store(m)
}

// Read reads packets from the job and rewrites them on their way out.
func (r *Readdress) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := r.Device.Read(bufs, sizes, offset)
	if m := r.m.Load(); m != nil {
		for i := 0; i < n; i++ {
			p := bufs[i][offset : offset+sizes[i]]
			if m.rewriteAddress {
				rewriteIPv4(p, 12, m.job, m.lease)
			}
			if m.rewriteDNS {
				rewriteIPv4(p, 16, m.jobDNS, m.gwDNS)
			}
		}
	}
	if m6 := r.m6.Load(); m6 != nil {
		for i := 0; i < n; i++ {
			m6.out(bufs[i][offset : offset+sizes[i]])
		}
	}
	return n, err
}

// Write rewrites packets on their way to the job and writes them.
func (r *Readdress) Write(bufs [][]byte, offset int) (int, error) {
	if m := r.m.Load(); m != nil {
		for _, b := range bufs {
			p := b[offset:]
			if m.rewriteAddress {
				rewriteIPv4(p, 16, m.lease, m.job)
			}
			if m.rewriteDNS {
				rewriteIPv4(p, 12, m.gwDNS, m.jobDNS)
			}
		}
	}
	if m6 := r.m6.Load(); m6 != nil {
		for _, b := range bufs {
			m6.in(b[offset:])
		}
	}
	return r.Device.Write(bufs, offset)
}

// rewriteIPv4 replaces the IPv4 address at byte at (12: source, 16:
// destination) of packet p by to if it is from, and fixes the header
// checksum and, for the first fragment of TCP and UDP, the transport
// checksum.
func rewriteIPv4(p []byte, at int, from, to [4]byte) {
	if len(p) < 20 || p[0]>>4 != 4 {
		return
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 || len(p) < ihl || [4]byte(p[at:at+4]) != from {
		return
	}
	copy(p[at:at+4], to[:])
	fixChecksum(p[10:12], from, to)
	if binary.BigEndian.Uint16(p[6:8])&0x1fff != 0 {
		return // not the first fragment: no transport header
	}
	l4 := p[ihl:]
	switch p[9] {
	case 6: // TCP
		if len(l4) >= 18 {
			fixChecksum(l4[16:18], from, to)
		}
	case 17: // UDP: a zero checksum means none
		if len(l4) >= 8 && (l4[6] != 0 || l4[7] != 0) {
			fixChecksum(l4[6:8], from, to)
			if l4[6] == 0 && l4[7] == 0 {
				l4[6], l4[7] = 0xff, 0xff
			}
		}
	}
}

// fixChecksum updates the one's complement checksum at c for a change of
// four bytes from old to new (RFC 1624, equation 3).
func fixChecksum(c []byte, old, new [4]byte) {
	sum := uint32(^binary.BigEndian.Uint16(c))
	for i := 0; i < 4; i += 2 {
		sum += uint32(^binary.BigEndian.Uint16(old[i:]) & 0xffff)
		sum += uint32(binary.BigEndian.Uint16(new[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(c, ^uint16(sum))
}
