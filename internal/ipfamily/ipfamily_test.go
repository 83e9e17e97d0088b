// SPDX-License-Identifier: MIT

package ipfamily

import (
	"net/netip"
	"testing"
)

func TestOf(t *testing.T) {
	tests := []struct {
		a    string
		want *Family
	}{
		{"192.0.2.1", V4},
		{"::ffff:192.0.2.1", V4},
		{"2001:db8::1", V6},
		{"::", V6},
	}
	for _, tc := range tests {
		if got := Of(netip.MustParseAddr(tc.a)); got != tc.want {
			t.Errorf("Of(%s) = %v, want %v", tc.a, got, tc.want)
		}
	}
	if Of(netip.Addr{}) != nil {
		t.Error("Of(zero) is not nil")
	}
	for i, f := range All {
		if f.Index != i || Of(f.Unspecified) != f || !f.All.Contains(f.Unspecified) || f.All.Addr().BitLen() != f.Bits {
			t.Errorf("row %d (%v) is inconsistent", i, f)
		}
	}
}

func TestPacket(t *testing.T) {
	v4 := []byte{0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, 1, 198, 51, 100, 7, 0, 53, 0, 53, 0, 8, 0, 0}
	if f := OfPacket(v4); f != V4 {
		t.Fatalf("OfPacket(v4) = %v", f)
	}
	if a := V4.Addr(v4, V4.SrcOff); a != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("src %v", a)
	}
	if a := V4.Addr(v4, V4.DstOff); a != netip.MustParseAddr("198.51.100.7") {
		t.Errorf("dst %v", a)
	}
	if off, proto, ok := V4.PayloadOffset(v4); !ok || off != 20 || proto != 17 {
		t.Errorf("PayloadOffset = %d, %d, %v", off, proto, ok)
	}
	frag := append([]byte(nil), v4...)
	frag[7] = 1 // fragment offset 8
	if _, _, ok := V4.PayloadOffset(frag); ok {
		t.Error("a later fragment has a transport header")
	}
	v6 := make([]byte, 48)
	v6[0], v6[6] = 0x60, 58
	src, dst := netip.MustParseAddr("2001:db8::1").As16(), netip.MustParseAddr("2001:db8::2").As16()
	copy(v6[8:], src[:])
	copy(v6[24:], dst[:])
	if f := OfPacket(v6); f != V6 {
		t.Fatalf("OfPacket(v6) = %v", f)
	}
	if V6.Addr(v6, V6.SrcOff) != netip.AddrFrom16(src) || V6.Addr(v6, V6.DstOff) != netip.AddrFrom16(dst) {
		t.Error("IPv6 addresses")
	}
	if off, proto, ok := V6.PayloadOffset(v6); !ok || off != 40 || proto != 58 {
		t.Errorf("PayloadOffset = %d, %d, %v", off, proto, ok)
	}
	v6[6] = 44 // fragment header
	if _, _, ok := V6.PayloadOffset(v6); ok {
		t.Error("extension header: transport header found")
	}
	if OfPacket(nil) != nil || OfPacket([]byte{0x50}) != nil {
		t.Error("OfPacket of no IP")
	}
}
