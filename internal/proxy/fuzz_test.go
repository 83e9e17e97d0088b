package proxy

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzReadRequest feeds arbitrary bytes to the SOCKS5 request parser (what
// any local process may send once authenticated): it must not panic, and a
// parsed address must be an IP or a non-empty name.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte{5, 1, 0, 1, 192, 0, 2, 1, 0, 80})
	f.Add([]byte{5, 3, 0, 3, 4, 'a', '.', 'b', 'c', 0, 53})
	f.Add([]byte{5, 0x83, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 7, 1, 127, 0, 0, 1, 4, 0})
	f.Add([]byte{5, 1, 0, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		_, a, err := readRequest(br)
		if err != nil {
			return
		}
		if !a.ip.IsValid() && a.host == "" {
			t.Fatalf("parsed %+v from %x: neither IP nor name", a, b)
		}
		_, _ = readAddr(br) // the relay command's source address
	})
}
