// SPDX-License-Identifier: MIT

package seccompnotify

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzParseSockaddr feeds arbitrary bytes (what a job passes to connect)
// to the sockaddr parser: it must not panic and accepts only AF_INET or
// AF_INET6 of full length.
func FuzzParseSockaddr(f *testing.F) {
	v4 := make([]byte, unix.SizeofSockaddrInet4)
	binary.NativeEndian.PutUint16(v4, unix.AF_INET)
	f.Add(v4)
	v6 := make([]byte, unix.SizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(v6, unix.AF_INET6)
	f.Add(v6)
	f.Add([]byte{1, 0, '/', 't', 'm', 'p'})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 2 {
			return // handle never passes fewer than 2 bytes
		}
		ap, ok := parseSockaddr(b)
		fam := binary.NativeEndian.Uint16(b)
		switch {
		case !ok:
		case fam == unix.AF_INET && len(b) >= unix.SizeofSockaddrInet4 && ap.Addr().Is4():
		case fam == unix.AF_INET6 && len(b) >= unix.SizeofSockaddrInet6:
		default:
			t.Fatalf("parsed %v from family %d, %d bytes", ap, fam, len(b))
		}
	})
}

func TestParseSockaddr(t *testing.T) {
	b := make([]byte, unix.SizeofSockaddrInet6)
	binary.NativeEndian.PutUint16(b, unix.AF_INET6)
	binary.BigEndian.PutUint16(b[2:], 443)
	copy(b[8:], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7})
	ap, ok := parseSockaddr(b)
	if !ok || ap.String() != "192.0.2.7:443" {
		t.Errorf("v4-mapped sockaddr_in6: got %v %v, want 192.0.2.7:443 (unmapped)", ap, ok)
	}
	copy(b[8:], []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10})
	if ap, ok := parseSockaddr(b); !ok || ap.String() != "[2001:db8::10]:443" {
		t.Errorf("sockaddr_in6: got %v %v, want [2001:db8::10]:443", ap, ok)
	}
	if _, ok := parseSockaddr(b[:unix.SizeofSockaddrInet6-1]); ok {
		t.Error("short sockaddr_in6 accepted")
	}
}
