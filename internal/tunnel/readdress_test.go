// SPDX-License-Identifier: MIT

package tunnel

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"
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

func TestReaddress(t *testing.T) {
	job, lease := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("100.65.0.7")
	jobDNS, gwDNS := netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("100.65.0.1")
	outside := netip.MustParseAddr("203.0.113.2")
	ch := tuntest.NewChannelTUN()
	rd := NewReaddress(ch.TUN())
	rd.Set(job, lease, jobDNS, gwDNS)
	for _, proto := range []byte{6, 17} {
		for _, tc := range []struct {
			name           string
			src, dst       netip.Addr // as the job sends
			wantSrc, wantD netip.Addr // as the gateway gets it
		}{
			{"outside", job, outside, lease, outside},
			{"dns", job, jobDNS, lease, gwDNS},
		} {
			// ChannelTUN's channels are unbuffered: feed it from a goroutine.
			go func() { ch.Outbound <- ipv4Packet(proto, tc.src, tc.dst, []byte("hello, gateway!")) }()
			bufs, sizes := [][]byte{make([]byte, 2000)}, []int{0}
			n, err := rd.Read(bufs, sizes, 0)
			if err != nil || n != 1 {
				t.Fatalf("read: %d, %v", n, err)
			}
			p := bufs[0][:sizes[0]]
			if got := netip.AddrFrom4([4]byte(p[12:16])); got != tc.wantSrc {
				t.Errorf("proto %d %s: source %s, want %s", proto, tc.name, got, tc.wantSrc)
			}
			if got := netip.AddrFrom4([4]byte(p[16:20])); got != tc.wantD {
				t.Errorf("proto %d %s: destination %s, want %s", proto, tc.name, got, tc.wantD)
			}
			if sum16(p[:20], 0) != 0 || l4Checksum(p) != 0 {
				t.Errorf("proto %d %s: checksums invalid after rewriting out", proto, tc.name)
			}

			// The answer, as the gateway sends it, reaches the job with
			// the job's own addresses.
			reply := ipv4Packet(proto, tc.wantD, tc.wantSrc, []byte("hello, job"))
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
			if s, d := netip.AddrFrom4([4]byte(got[12:16])), netip.AddrFrom4([4]byte(got[16:20])); s != tc.dst || d != tc.src {
				t.Errorf("proto %d %s: reply %s → %s, want %s → %s", proto, tc.name, s, d, tc.dst, tc.src)
			}
			if sum16(got[:20], 0) != 0 || l4Checksum(got) != 0 {
				t.Errorf("proto %d %s: checksums invalid after rewriting in", proto, tc.name)
			}
		}
	}

	// Equal addresses: pass-through.
	rd.Set(job, job, jobDNS, jobDNS)
	pkt := ipv4Packet(17, job, jobDNS, []byte("x"))
	go func() { ch.Outbound <- append([]byte(nil), pkt...) }()
	bufs, sizes := [][]byte{make([]byte, 2000)}, []int{0}
	if _, err := rd.Read(bufs, sizes, 0); err != nil {
		t.Fatal(err)
	}
	if string(bufs[0][:sizes[0]]) != string(pkt) {
		t.Errorf("pass-through changed the packet")
	}
}
