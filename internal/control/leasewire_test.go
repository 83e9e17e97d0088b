// SPDX-License-Identifier: MIT

package control

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
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
		Addresses:   []netip.Prefix{netip.MustParsePrefix("100.64.0.2/16"), netip.MustParsePrefix("fd00:1::6440:2/48")},
		Gateways:    []netip.Addr{netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("fd00:1::6440:1")},
		DNS:         []netip.Addr{netip.MustParseAddr("100.64.0.1"), netip.MustParseAddr("fd00:1::6440:1")},
		PublicAddrs: []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")},
		Ports:       [2]uint16{20000, 20255},
		Exposed: []Exposed{
			{Port: Port{Proto: ProtoTCP, Port: 80}, PublicAddr: netip.MustParseAddr("203.0.113.1"), PublicPort: 20000},
			{Port: Port{Proto: ProtoTCP, Port: 80}, PublicAddr: netip.MustParseAddr("2001:db8::1"), PublicPort: 20000},
		},
		MTU: 1420, Endpoint: "198.51.100.1:8443",
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
		`"address":"100.64.0.2/16"`, `"address6":"fd00:1::6440:2/48"`, `"gateway":"100.64.0.1"`, `"gateway6":"fd00:1::6440:1"`,
		`"public_addr":"203.0.113.1"`, `"public_addr6":"2001:db8::1"`,
		`"exposed":[{"proto":"tcp","port":80,"public_addr":"203.0.113.1","public_port":20000}]`,
		`"exposed6":[{"proto":"tcp","port":80,"public_addr":"2001:db8::1","public_port":20000}]`,
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
		// An old client decodes the fields both versions share and
		// version 1's per-family fields.
		var got struct {
			leaseFields
			leaseV1
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		want := leaseV1{
			Address: l.Addresses[0], Address6: l.Addresses[1], Gateway: l.Gateways[0], Gateway6: l.Gateways[1],
			PublicAddr: l.PublicAddrs[0], PublicAddr6: l.PublicAddrs[1], Exposed: l.Exposed[:1], Exposed6: l.Exposed[1:],
		}
		if !reflect.DeepEqual(got.leaseV1, want) || got.ID != l.ID || got.Ports != l.Ports || !reflect.DeepEqual(got.DNS, l.DNS) {
			t.Errorf("an old client reads %+v; want %+v", got, want)
		}
	})
	t.Run("NewClientOldGateway", func(t *testing.T) {
		// What a gateway of an earlier release sends: no lists.
		f := leaseFields(l)
		old, err := json.Marshal(struct {
			*leaseFields
			leaseV1
		}{&f, l.v1()})
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
		if !reflect.DeepEqual(got.Addresses, []netip.Prefix{netip.MustParsePrefix("fd7a::2/112")}) || !reflect.DeepEqual(got.Gateways, []netip.Addr{netip.MustParseAddr("fd7a::1")}) ||
			!reflect.DeepEqual(got.PublicAddrs, []netip.Addr{netip.MustParseAddr("2001:db8::5")}) {
			t.Errorf("an IPv6-only lease: %+v", got)
		}
	})
}

// TestLeaseWireIPv6Only: an IPv6-only lease's lists have one entry each;
// its version-1 fields hold the tunnel addresses in the first ones
// (address, gateway) and the egress address in public_addr6.
func TestLeaseWireIPv6Only(t *testing.T) {
	l := Lease{ID: "l3", GatewayPublicKey: testGatewayKey(t), Addresses: []netip.Prefix{netip.MustParsePrefix("fd7a::2/112")},
		Gateways: []netip.Addr{netip.MustParseAddr("fd7a::1")}, PublicAddrs: []netip.Addr{netip.MustParseAddr("2001:db8::5")}}
	b, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"addresses":["fd7a::2/112"]`, `"address":"fd7a::2/112"`, `"gateway":"fd7a::1"`, `"public_addr6":"2001:db8::5"`, `"public_addrs":["2001:db8::5"]`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("wire form lacks %s: %s", want, b)
		}
	}
	if strings.Contains(string(b), "address6") || strings.Contains(string(b), "gateway6") {
		t.Errorf("wire form of an IPv6-only lease has a second-family field: %s", b)
	}
	var got Lease
	if err := json.Unmarshal(b, &got); err != nil || !reflect.DeepEqual(got, l) {
		t.Errorf("round trip: %+v, %v; want %+v", got, err, l)
	}
}

// TestLeaseWireBadLists: a list with two entries of one family, or more
// than one per family, is refused, and so are version-1 fields of one
// family twice.
func TestLeaseWireBadLists(t *testing.T) {
	for _, in := range []string{
		`{"addresses":["100.64.0.2/16","100.64.0.3/16"]}`,
		`{"gateways":["fd7a::1","fd7a::2"]}`,
		`{"public_addrs":["203.0.113.1","2001:db8::1","203.0.113.2"]}`,
		`{"addresses":["::ffff:100.64.0.2/112"]}`,
		`{"address":"100.64.0.2/16","address6":"100.64.0.3/16"}`,
		`{"public_addr":"2001:db8::1","public_addr6":"2001:db8::2"}`,
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
		if !slices.Equal(l2.Addresses, l.Addresses) || !slices.Equal(l2.Gateways, l.Gateways) || !slices.Equal(l2.PublicAddrs, l.PublicAddrs) ||
			!slices.Equal(l2.Exposed, l.Exposed) {
			t.Fatalf("addresses changed on the wire: %+v, then %+v", l, l2)
		}
	})
}
