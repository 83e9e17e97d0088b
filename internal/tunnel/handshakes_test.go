// SPDX-License-Identifier: MIT

package tunnel

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

func TestParsePeers(t *testing.T) {
	a, b, c, d := wgkey.Key{1}, wgkey.Key{2}, wgkey.Key{3}, wgkey.Key{4}
	in := strings.Join([]string{
		"private_key=" + wgkey.Key{9}.Hex(),
		"listen_port=8443",
		"public_key=" + a.Hex(),
		"endpoint=198.51.100.2:40000",
		"last_handshake_time_sec=1700000000",
		"last_handshake_time_nsec=5",
		"allowed_ip=100.64.0.2/32",
		"public_key=" + b.Hex(), // never shook hands
		"last_handshake_time_sec=0",
		"last_handshake_time_nsec=0",
		"public_key=nothex",
		"last_handshake_time_sec=12",
		"public_key=" + c.Hex(),
		"endpoint=tcp:198.51.100.3:8443", // over the TCP transport
		"last_handshake_time_sec=1700000001",
		"public_key=" + d.Hex(),
		"endpoint=[::ffff:198.51.100.4]:51820",
		"errno=0",
	}, "\n")
	got := parsePeers(in)
	want := map[wgkey.Key]PeerState{
		a: {LastHandshake: time.Unix(1700000000, 5), Endpoint: netip.MustParseAddrPort("198.51.100.2:40000")},
		b: {},
		c: {LastHandshake: time.Unix(1700000001, 0)},
		d: {Endpoint: netip.MustParseAddrPort("198.51.100.4:51820")},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, w := range want {
		if g := got[k]; !g.LastHandshake.Equal(w.LastHandshake) || g.Endpoint != w.Endpoint {
			t.Errorf("peer %v: got %+v, want %+v", k, g, w)
		}
	}
}

// FuzzParseHandshakes checks that any UAPI text parses without panicking
// and yields only non-zero times and valid or zero endpoints.
func FuzzParseHandshakes(f *testing.F) {
	f.Add("public_key=" + wgkey.Key{1}.Hex() + "\nlast_handshake_time_sec=1\n")
	f.Add("public_key=\n=\nlast_handshake_time_nsec=-1")
	f.Add("public_key=" + wgkey.Key{1}.Hex() + "\nendpoint=[::1]:0\n")
	f.Fuzz(func(t *testing.T, s string) {
		for k, v := range parsePeers(s) {
			if !v.LastHandshake.IsZero() && v.LastHandshake.Equal(time.Unix(0, 0)) {
				t.Fatalf("peer %v: zero time", k)
			}
			if v.Endpoint.IsValid() && v.Endpoint.Addr().Is4In6() {
				t.Fatalf("peer %v: endpoint %v not unmapped", k, v.Endpoint)
			}
		}
	})
}
