// SPDX-License-Identifier: MIT

package tunnel

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"
)

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

// TestReaddressIPv6: a dual-stack job keeps its IPv6 address and resolver
// when its lease changes; TCP, UDP and ICMPv6 checksums stay valid both
// ways; IPv4 packets are not touched by the IPv6 mapping.
func TestReaddressIPv6(t *testing.T) {
	job, lease := netip.MustParseAddr("fd00:1::6440:2"), netip.MustParseAddr("fd00:2::6440:9")
	jobDNS, gwDNS := netip.MustParseAddr("fd00:1::6440:1"), netip.MustParseAddr("fd00:2::6440:1")
	outside := netip.MustParseAddr("2001:db8::2")
	ch := tuntest.NewChannelTUN()
	rd := NewReaddress(ch.TUN())
	rd.SetIPv6(job, lease, jobDNS, gwDNS)
	for _, proto := range []byte{6, 17, 58} {
		for _, tc := range []struct {
			name           string
			src, dst       netip.Addr
			wantSrc, wantD netip.Addr
		}{
			{"outside", job, outside, lease, outside},
			{"dns", job, jobDNS, lease, gwDNS},
		} {
			go func() { ch.Outbound <- ipv6Packet(proto, tc.src, tc.dst, []byte("hello, gateway!")) }()
			bufs, sizes := [][]byte{make([]byte, 2000)}, []int{0}
			if n, err := rd.Read(bufs, sizes, 0); err != nil || n != 1 {
				t.Fatalf("read: %d, %v", n, err)
			}
			p := bufs[0][:sizes[0]]
			if s, d := netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40])); s != tc.wantSrc || d != tc.wantD {
				t.Errorf("proto %d %s: %s → %s, want %s → %s", proto, tc.name, s, d, tc.wantSrc, tc.wantD)
			}
			if l4Checksum6(p) != 0 {
				t.Errorf("proto %d %s: checksum invalid after rewriting out", proto, tc.name)
			}
			reply := ipv6Packet(proto, tc.wantD, tc.wantSrc, []byte("hello, job"))
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
			if s, d := netip.AddrFrom16([16]byte(got[8:24])), netip.AddrFrom16([16]byte(got[24:40])); s != tc.dst || d != tc.src {
				t.Errorf("proto %d %s: reply %s → %s, want %s → %s", proto, tc.name, s, d, tc.dst, tc.src)
			}
			if l4Checksum6(got) != 0 {
				t.Errorf("proto %d %s: checksum invalid after rewriting in", proto, tc.name)
			}
		}
	}
	// IPv4 untouched; an IPv4-only new lease turns the IPv6 mapping off.
	pkt := ipv4Packet(17, netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("203.0.113.2"), []byte("x"))
	go func() { ch.Outbound <- append([]byte(nil), pkt...) }()
	bufs, sizes := [][]byte{make([]byte, 2000)}, []int{0}
	if _, err := rd.Read(bufs, sizes, 0); err != nil || string(bufs[0][:sizes[0]]) != string(pkt) {
		t.Errorf("IPv4 packet changed by the IPv6 mapping (%v)", err)
	}
	rd.SetIPv6(job, netip.Addr{}, jobDNS, netip.Addr{})
	if rd.m6.Load() != nil {
		t.Error("SetIPv6 with an IPv4-only lease left a mapping")
	}
}
