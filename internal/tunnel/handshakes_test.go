// SPDX-License-Identifier: MIT

package tunnel

import (
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

func TestParseHandshakes(t *testing.T) {
	a, b, c := wgkey.Key{1}, wgkey.Key{2}, wgkey.Key{3}
	in := strings.Join([]string{
		"private_key=" + wgkey.Key{9}.Hex(),
		"listen_port=8443",
		"public_key=" + a.Hex(),
		"last_handshake_time_sec=1700000000",
		"last_handshake_time_nsec=5",
		"allowed_ip=100.64.0.2/32",
		"public_key=" + b.Hex(), // never shook hands
		"last_handshake_time_sec=0",
		"last_handshake_time_nsec=0",
		"public_key=nothex",
		"last_handshake_time_sec=12",
		"public_key=" + c.Hex(),
		"last_handshake_time_sec=1700000001",
		"errno=0",
	}, "\n")
	got := parseHandshakes(in)
	want := map[wgkey.Key]time.Time{a: time.Unix(1700000000, 5), c: time.Unix(1700000001, 0)}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, w := range want {
		if !got[k].Equal(w) {
			t.Errorf("peer %v: got %v, want %v", k, got[k], w)
		}
	}
}

// FuzzParseHandshakes checks that any UAPI text parses without panicking
// and yields only non-zero times.
func FuzzParseHandshakes(f *testing.F) {
	f.Add("public_key=" + wgkey.Key{1}.Hex() + "\nlast_handshake_time_sec=1\n")
	f.Add("public_key=\n=\nlast_handshake_time_nsec=-1")
	f.Fuzz(func(t *testing.T, s string) {
		for k, v := range parseHandshakes(s) {
			if v.IsZero() || v.Equal(time.Unix(0, 0)) {
				t.Fatalf("peer %v: zero time", k)
			}
		}
	})
}
