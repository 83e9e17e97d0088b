// SPDX-License-Identifier: MIT

package tunnel

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

func sum16(b []byte, initial uint32) uint16 {
	s := initial
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// ipv4Packet builds an IPv4 packet of protocol proto from src to dst with
// an 8- (UDP) or 20-byte (TCP) header and payload, all checksums valid.
func ipv4Packet(proto byte, src, dst netip.Addr, payload []byte) []byte {
	l4len := 8
	if proto == 6 {
		l4len = 20
	}
	p := make([]byte, 20+l4len+len(payload))
	p[0], p[8], p[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	s, d := src.As4(), dst.As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[10:], sum16(p[:20], 0))
	l4 := p[20:]
	binary.BigEndian.PutUint16(l4[0:], 40000)
	binary.BigEndian.PutUint16(l4[2:], 53)
	copy(l4[l4len:], payload)
	if proto == 6 {
		l4[12] = 5 << 4
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	}
	at := 6
	if proto == 6 {
		at = 16
	}
	binary.BigEndian.PutUint16(l4[at:], l4Checksum(p))
	return p
}

// l4Checksum computes the transport checksum of p with its checksum field
// taken as is (valid packets give 0).
func l4Checksum(p []byte) uint16 {
	l4 := p[20:]
	var pseudo uint32
	for i := 12; i < 20; i += 2 {
		pseudo += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	pseudo += uint32(p[9]) + uint32(len(l4))
	return sum16(l4, pseudo)
}

// l4Checksum6 computes the transport checksum of the IPv6 packet p with
// its checksum field taken as is (valid packets give 0).
func l4Checksum6(p []byte) uint16 {
	l4 := p[40:]
	var pseudo uint32
	for i := 8; i < 40; i += 2 {
		pseudo += uint32(binary.BigEndian.Uint16(p[i:]))
	}
	pseudo += uint32(len(l4)) + uint32(p[6])
	return sum16(l4, pseudo)
}

// ipv6Packet builds an IPv6 packet of next header proto (TCP, UDP or
// ICMPv6) from src to dst with a valid checksum.
func ipv6Packet(proto byte, src, dst netip.Addr, payload []byte) []byte {
	l4len, at := 8, 6
	switch proto {
	case 6:
		l4len, at = 20, 16
	case 58:
		l4len, at = 8, 2
	}
	p := make([]byte, 40+l4len+len(payload))
	p[0], p[6], p[7] = 0x60, proto, 64
	binary.BigEndian.PutUint16(p[4:], uint16(l4len+len(payload)))
	s, d := src.As16(), dst.As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	l4 := p[40:]
	switch proto {
	case 6:
		binary.BigEndian.PutUint16(l4[0:], 40000)
		binary.BigEndian.PutUint16(l4[2:], 443)
		l4[12] = 5 << 4
	case 17:
		binary.BigEndian.PutUint16(l4[0:], 40000)
		binary.BigEndian.PutUint16(l4[2:], 53)
		binary.BigEndian.PutUint16(l4[4:], uint16(l4len+len(payload)))
	case 58:
		l4[0] = 128 // echo request
	}
	copy(l4[l4len:], payload)
	binary.BigEndian.PutUint16(l4[at:], l4Checksum6(p))
	return p
}

// checksumsOK reports whether the packet p of family f has valid
// checksums: IPv4's header and transport ones, IPv6's transport one.
func checksumsOK(f *ipfamily.Family, p []byte) bool {
	if f == ipfamily.V4 {
		return sum16(p[:20], 0) == 0 && l4Checksum(p) == 0
	}
	return l4Checksum6(p) == 0
}

// TestReaddress: a job keeps its addresses and resolvers of both families
// when its lease changes; the addresses of each family are rewritten from
// that family's mapping alone, with TCP, UDP (and ICMPv6) checksums (and
// IPv4's header checksum) valid both ways.
func TestReaddress(t *testing.T) {
	type family struct {
		f                                  *ipfamily.Family
		job, lease, jobDNS, gwDNS, outside netip.Addr
		protos                             []byte
		packet                             func(proto byte, src, dst netip.Addr, payload []byte) []byte
	}
	fams := []family{
		{ipfamily.V4, netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("100.65.0.7"), netip.MustParseAddr("100.64.0.1"),
			netip.MustParseAddr("100.65.0.1"), netip.MustParseAddr("203.0.113.2"), []byte{6, 17}, ipv4Packet},
		{ipfamily.V6, netip.MustParseAddr("fd00:1::6440:2"), netip.MustParseAddr("fd00:2::6440:9"), netip.MustParseAddr("fd00:1::6440:1"),
			netip.MustParseAddr("fd00:2::6440:1"), netip.MustParseAddr("2001:db8::2"), []byte{6, 17, 58}, ipv6Packet},
	}
	ch := tuntest.NewChannelTUN()
	rd := NewReaddress(ch.TUN())
	rd.Set([]netip.Addr{fams[0].job, fams[1].job}, []netip.Addr{fams[0].lease, fams[1].lease},
		[]netip.Addr{fams[0].jobDNS, fams[1].jobDNS}, []netip.Addr{fams[0].gwDNS, fams[1].gwDNS})
	for _, fam := range fams {
		f := fam.f
		addr := func(p []byte, off int) netip.Addr { return f.Addr(p, off) }
		for _, proto := range fam.protos {
			for _, tc := range []struct {
				name           string
				src, dst       netip.Addr // as the job sends
				wantSrc, wantD netip.Addr // as the gateway gets it
			}{
				{"outside", fam.job, fam.outside, fam.lease, fam.outside},
				{"dns", fam.job, fam.jobDNS, fam.lease, fam.gwDNS},
			} {
				// ChannelTUN's channels are unbuffered: feed it from a goroutine.
				go func() { ch.Outbound <- fam.packet(proto, tc.src, tc.dst, []byte("hello, gateway!")) }()
				bufs, sizes := [][]byte{make([]byte, 2000)}, []int{0}
				if n, err := rd.Read(bufs, sizes, 0); err != nil || n != 1 {
					t.Fatalf("read: %d, %v", n, err)
				}
				p := bufs[0][:sizes[0]]
				if s, d := addr(p, f.SrcOff), addr(p, f.DstOff); s != tc.wantSrc || d != tc.wantD {
					t.Errorf("%v proto %d %s: %s → %s, want %s → %s", f, proto, tc.name, s, d, tc.wantSrc, tc.wantD)
				}
				if !checksumsOK(f, p) {
					t.Errorf("%v proto %d %s: checksums invalid after rewriting out", f, proto, tc.name)
				}
				// The answer, as the gateway sends it, reaches the job
				// with the job's own addresses.
				reply := fam.packet(proto, tc.wantD, tc.wantSrc, []byte("hello, job"))
				werr := make(chan error, 1)
				go func() { _, err := rd.Write([][]byte{reply}, 0); werr <- err }()
				var got []byte
				select {
				case got = <-ch.Inbound:
				case <-time.After(time.Second):
					t.Fatal("no packet written")
				}
				if err := <-werr; err != nil {
					t.Fatal(err)
				}
				if s, d := addr(got, f.SrcOff), addr(got, f.DstOff); s != tc.dst || d != tc.src {
					t.Errorf("%v proto %d %s: reply %s → %s, want %s → %s", f, proto, tc.name, s, d, tc.dst, tc.src)
				}
				if !checksumsOK(f, got) {
					t.Errorf("%v proto %d %s: checksums invalid after rewriting in", f, proto, tc.name)
				}
			}
		}
	}
	// A lease of one family leaves the other untouched; equal addresses
	// pass through.
	rd.Set([]netip.Addr{fams[0].job, fams[1].job}, []netip.Addr{fams[0].lease}, []netip.Addr{fams[0].jobDNS}, []netip.Addr{fams[0].gwDNS})
	if ms := rd.m.Load(); ms == nil || ms[1] != nil {
		t.Error("Set with an IPv4-only lease left an IPv6 mapping")
	}
	rd.Set([]netip.Addr{fams[0].job}, []netip.Addr{fams[0].job}, []netip.Addr{fams[0].jobDNS}, []netip.Addr{fams[0].jobDNS})
	pkt := ipv4Packet(17, fams[0].job, fams[0].jobDNS, []byte("x"))
	go func() { ch.Outbound <- append([]byte(nil), pkt...) }()
	bufs, sizes := [][]byte{make([]byte, 2000)}, []int{0}
	if _, err := rd.Read(bufs, sizes, 0); err != nil {
		t.Fatal(err)
	}
	if string(bufs[0][:sizes[0]]) != string(pkt) || rd.m.Load() != nil {
		t.Errorf("pass-through changed the packet")
	}
}
