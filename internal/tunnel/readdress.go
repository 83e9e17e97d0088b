// SPDX-License-Identifier: MIT

package tunnel

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync/atomic"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// Readdress is a tun.Device decorator that lets a job keep the tunnel
// addresses it started with when its lease changes to other ones (a new
// lease after its old one was lost, or another gateway with another
// subnet): packets the job sends have their source rewritten from the
// job's address to the lease's, and their destination from the job's DNS
// server to the gateway's; packets to the job get the reverse. One
// rewrite serves both families, driven by the family table
// (internal/ipfamily: where the addresses are, whose checksums cover
// them): IPv4's header checksum, and the TCP and UDP checksums (and
// ICMPv6's, which covers its pseudo-header too) are updated incrementally
// (RFC 1624). IPv6 packets whose transport header follows extension
// headers, and later IPv4 fragments, keep their transport checksums. Until
// Set is called with two different addresses of a family, packets of that
// family pass through untouched. It is safe for concurrent use.
type Readdress struct {
	tun.Device
	m atomic.Pointer[[ipfamily.N]*addrMap]
}

// addrMap is one family's mapping: the job's own address ↔ the lease's,
// the job's resolver ↔ the current gateway's (nil slices: none).
type addrMap struct {
	job, lease    []byte
	jobDNS, gwDNS []byte
}

// NewReaddress wraps dev.
func NewReaddress(dev tun.Device) *Readdress { return &Readdress{Device: dev} }

// Set makes each of the job's addresses job appear outside as the lease's
// address of its family (in lease), and each of the job's resolvers
// jobDNS as the current gateway's of its family (in gwDNS). A family
// missing on either side, or whose two addresses are equal, passes
// through untouched.
func (r *Readdress) Set(job, lease, jobDNS, gwDNS []netip.Addr) {
	var ms [ipfamily.N]*addrMap
	any := false
	for _, f := range ipfamily.All {
		m := &addrMap{}
		m.job, m.lease = pair(f, job, lease)
		m.jobDNS, m.gwDNS = pair(f, jobDNS, gwDNS)
		if m.job != nil || m.jobDNS != nil {
			ms[f.Index], any = m, true
		}
	}
	if !any {
		r.m.Store(nil)
		return
	}
	r.m.Store(&ms)
}

// pair returns the addresses of family f in from and to as bytes, or nil
// when either has none or they are equal.
func pair(f *ipfamily.Family, from, to []netip.Addr) ([]byte, []byte) {
	a, b := of(f, from), of(f, to)
	if !a.IsValid() || !b.IsValid() || a == b {
		return nil, nil
	}
	return a.AsSlice(), b.AsSlice()
}

// of returns the first address of family f in as.
func of(f *ipfamily.Family, as []netip.Addr) netip.Addr {
	for _, a := range as {
		if f.Contains(a) && !a.Is4In6() {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

// Read reads packets from the job and rewrites them on their way out.
func (r *Readdress) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := r.Device.Read(bufs, sizes, offset)
	if ms := r.m.Load(); ms != nil {
		for i := 0; i < n; i++ {
			p := bufs[i][offset : offset+sizes[i]]
			if f := ipfamily.OfPacket(p); f != nil && ms[f.Index] != nil {
				m := ms[f.Index]
				rewrite(f, p, f.SrcOff, m.job, m.lease)
				rewrite(f, p, f.DstOff, m.jobDNS, m.gwDNS)
			}
		}
	}
	return n, err
}

// Write rewrites packets on their way to the job and writes them.
func (r *Readdress) Write(bufs [][]byte, offset int) (int, error) {
	if ms := r.m.Load(); ms != nil {
		for _, b := range bufs {
			p := b[offset:]
			if f := ipfamily.OfPacket(p); f != nil && ms[f.Index] != nil {
				m := ms[f.Index]
				rewrite(f, p, f.DstOff, m.lease, m.job)
				rewrite(f, p, f.SrcOff, m.gwDNS, m.jobDNS)
			}
		}
	}
	return r.Device.Write(bufs, offset)
}

// rewrite replaces the address of family f at byte at (its SrcOff or
// DstOff) of packet p by to if it is from (nil: nothing to do), and fixes
// the checksums that cover it: IPv4's header checksum, then, where the
// transport header follows, TCP's, UDP's (IPv4: unless it has none) and
// ICMPv6's.
func rewrite(f *ipfamily.Family, p []byte, at int, from, to []byte) {
	n := len(from)
	if n == 0 || len(p) < f.HeaderLen || !bytes.Equal(p[at:at+n], from) {
		return
	}
	if f == ipfamily.V4 {
		if ihl := int(p[0]&0x0f) * 4; ihl < f.HeaderLen || len(p) < ihl {
			return
		}
	}
	copy(p[at:at+n], to)
	if f == ipfamily.V4 {
		fixChecksum(p[10:12], from, to)
	}
	off, proto, ok := f.PayloadOffset(p)
	if !ok {
		return // a later fragment, or extension headers: no transport header here
	}
	l4 := p[off:]
	switch {
	case proto == 6 && len(l4) >= 18: // TCP
		fixChecksum(l4[16:18], from, to)
	case proto == 17 && len(l4) >= 8: // UDP
		if f == ipfamily.V4 && l4[6] == 0 && l4[7] == 0 {
			return // IPv4: a zero checksum means none
		}
		fixChecksum(l4[6:8], from, to)
		if l4[6] == 0 && l4[7] == 0 {
			l4[6], l4[7] = 0xff, 0xff
		}
	case proto == 58 && f == ipfamily.V6 && len(l4) >= 4: // ICMPv6 covers the pseudo-header
		fixChecksum(l4[2:4], from, to)
	}
}

// fixChecksum updates the one's complement checksum at c for a change of
// len(old) (even) bytes from old to new (RFC 1624, equation 3).
func fixChecksum(c, old, new []byte) {
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
