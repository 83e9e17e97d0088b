// SPDX-License-Identifier: MIT

package control

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

func testGatewayKey(t *testing.T) wgkey.Key {
	t.Helper()
	priv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return priv.PublicKey()
}

func dualStackLease(t *testing.T) Lease {
	return Lease{
		GatewayPublicKey: testGatewayKey(t),
		ID:               "l1", Secret: "s",
		Address: netip.MustParsePrefix("100.64.0.2/16"), Gateway: netip.MustParseAddr("100.64.0.1"),
		Address6: netip.MustParsePrefix("fd00:1::6440:2/48"), Gateway6: netip.MustParseAddr("fd00:1::6440:1"),
		DNS:        []netip.Addr{netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("fd00:1::6440:1")},
		PublicAddr: netip.MustParseAddr("203.0.113.1"), Ports: [2]uint16{20000, 20255},
		PublicAddr6: netip.MustParseAddr("2001:db8::1"),
		MTU:         1420, Endpoint: "198.51.100.1:8443",
	}
}

// TestLeaseWireVersions: a lease of this release carries its addresses
// both as version-2 lists and as the version-1 per-family fields, so an
// old client (which knows only the fields) reads it as before, and this
// client reads an old gateway's lease (fields only) as well as a new one.
func TestLeaseWireVersions(t *testing.T) {
	l := dualStackLease(t)
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"addresses":["100.64.0.2/16","fd00:1::6440:2/48"]`, `"gateways":["100.64.0.1","fd00:1::6440:1"]`,
		`"public_addrs":["203.0.113.1","2001:db8::1"]`,
		`"address":"100.64.0.2/16"`, `"address6":"fd00:1::6440:2/48"`, `"gateway6":"fd00:1::6440:1"`, `"public_addr6":"2001:db8::1"`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("wire form lacks %s: %s", want, b)
		}
	}
	t.Run("NewClientNewGateway", func(t *testing.T) {
		var got Lease
		if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got, l) {
			t.Errorf("round trip: %+v, %v; want %+v", got, err, l)
		}
	})
	t.Run("OldClientNewGateway", func(t *testing.T) {
		// leaseV1 decodes as Lease did before version 2: fields only.
		var got leaseV1
		if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(Lease(got), l) {
			t.Errorf("an old client reads %+v, %v; want %+v", got, err, l)
		}
	})
	t.Run("NewClientOldGateway", func(t *testing.T) {
		old, err := json.Marshal(leaseV1(l)) // what a gateway of an earlier release sends
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(old), `"addresses"`) {
			t.Fatalf("the version-1 form has lists: %s", old)
		}
		var got Lease
		if err := json.Unmarshal(old, &got); err != nil || !reflect.DeepEqual(got, l) {
			t.Errorf("a version-1 lease reads %+v, %v; want %+v", got, err, l)
		}
	})
	t.Run("ListsWin", func(t *testing.T) {
		// A version-2 gateway's lists are what the client uses.
		in := `{"id":"l2","address":"100.64.0.9/16","addresses":["fd7a::2/112"],"gateways":["fd7a::1"],"public_addrs":["2001:db8::5"]}`
		var got Lease
		if err := json.Unmarshal([]byte(in), &got); err != nil {
			t.Fatal(err)
		}
		if got.Address != netip.MustParsePrefix("fd7a::2/112") || got.Address6.IsValid() || got.Gateway != netip.MustParseAddr("fd7a::1") || got.PublicAddr != netip.MustParseAddr("2001:db8::5") {
			t.Errorf("an IPv6-only lease: %+v", got)
		}
	})
}

// TestLeaseWireIPv6Only: an IPv6-only lease's lists have one entry each,
// and its version-1 fields hold the IPv6 addresses in the primary ones.
func TestLeaseWireIPv6Only(t *testing.T) {
	l := Lease{ID: "l3", GatewayPublicKey: testGatewayKey(t), Address: netip.MustParsePrefix("fd7a::2/112"), Gateway: netip.MustParseAddr("fd7a::1"), PublicAddr: netip.MustParseAddr("2001:db8::5")}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"addresses":["fd7a::2/112"]`) || strings.Contains(string(b), "address6") {
		t.Errorf("wire form: %s", b)
	}
	var got Lease
	if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got, l) {
		t.Errorf("round trip: %+v, %v; want %+v", got, err, l)
	}
}

// TestLeaseWireBadLists: a list with two entries of one family, or more
// than one per family, is refused.
func TestLeaseWireBadLists(t *testing.T) {
	for _, in := range []string{
		`{"addresses":["100.64.0.2/16","100.64.0.3/16"]}`,
		`{"gateways":["fd7a::1","fd7a::2"]}`,
		`{"public_addrs":["203.0.113.1","2001:db8::1","203.0.113.2"]}`,
		`{"addresses":["::ffff:100.64.0.2/112"]}`,
	} {
		var l Lease
		if err := json.Unmarshal([]byte(in), &l); err == nil {
			t.Errorf("%s: no error", in)
		}
	}
}

// FuzzDecodeLease: any bytes decode to a lease or an error, never a
// panic; a lease that decodes keeps its addresses through another trip
// on the wire.
func FuzzDecodeLease(f *testing.F) {
	for _, s := range []string{
		`{"addresses":["100.64.0.2/16","fd00::2/48"],"gateways":["100.64.0.1"],"public_addrs":["2001:db8::1","203.0.113.1"]}`,
		`{"address":"100.64.0.2/16","address6":"fd00::2/48","gateway":"100.64.0.1","public_addr6":"2001:db8::1"}`,
		`{"addresses":["fd7a::2/112"]}`, `{"addresses":[]}`, `{"gateways":null}`,
	} {
		f.Add([]byte(s))
	}
	priv, err := wgkey.Generate()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var l Lease
		if json.Unmarshal(b, &l) != nil {
			return
		}
		// A lease without a key decodes, but a zero key does not (wgkey).
		l.GatewayPublicKey = priv.PublicKey()
		again, err := json.Marshal(l)
		if err != nil {
			return // e.g. a key that does not encode
		}
		var l2 Lease
		if err := json.Unmarshal(again, &l2); err != nil {
			t.Fatalf("a decoded lease does not decode again: %v: %s", err, again)
		}
		if l2.Address != l.Address || l2.Address6 != l.Address6 || l2.Gateway != l.Gateway || l2.Gateway6 != l.Gateway6 ||
			l2.PublicAddr != l.PublicAddr || l2.PublicAddr6 != l.PublicAddr6 {
			t.Fatalf("addresses changed on the wire: %+v, then %+v", l, l2)
		}
	})
}
