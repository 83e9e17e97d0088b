// SPDX-License-Identifier: MIT

package gateway

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// TestDescribe: the lease a join returns lists the job's tunnel
// addresses, the gateway's (also its resolvers), its egress addresses and
// its exposures IPv4 first, whatever order the lease and the job hold them
// in, one entry per family; an IPv6-only job's lists hold its IPv6 ones.
func TestDescribe(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	block := portblock.Range{Lo: 20000, Hi: 20255}
	tunnels := []netip.Prefix{p("100.64.0.1/16"), p("fd00:1::6440:1/48")}
	ex := func(pub string) forward.Exposure {
		return forward.Exposure{Proto: ipproto.TCP, JobPort: 80, PublicPort: 20000, PublicAddr: a(pub)}
	}
	cex := func(pub string) control.Exposed {
		return control.Exposed{Port: control.Port{Proto: control.ProtoTCP, Port: 80}, PublicAddr: a(pub), PublicPort: 20000}
	}
	for _, tt := range []struct {
		name    string
		tunnels []netip.Prefix
		l       lease.Lease
		job     forward.Job
		want    control.Lease
	}{{
		name:    "dual stack",
		tunnels: tunnels,
		l:       lease.Lease{Addrs: []netip.Prefix{p("fd00:1::6440:2/48"), p("100.64.0.2/16")}},
		job: forward.Job{
			Egress:    []forward.Egress{{Addr: a("2001:db8::1"), Block: block}, {Addr: a("203.0.113.1"), Block: block}},
			Exposures: []forward.Exposure{ex("2001:db8::1"), ex("203.0.113.1")},
		},
		want: control.Lease{
			Addresses: []netip.Prefix{p("100.64.0.2/16"), p("fd00:1::6440:2/48")},
			Gateways:  []netip.Addr{a("100.64.0.1"), a("fd00:1::6440:1")}, DNS: []netip.Addr{a("100.64.0.1"), a("fd00:1::6440:1")},
			PublicAddrs: []netip.Addr{a("203.0.113.1"), a("2001:db8::1")}, Ports: [2]uint16{20000, 20255},
			Exposed: []control.Exposed{cex("203.0.113.1"), cex("2001:db8::1")},
		},
	}, {
		name:    "IPv6 only",
		tunnels: []netip.Prefix{p("fd7a::1/112")},
		l:       lease.Lease{Addrs: []netip.Prefix{p("fd7a::2/112")}},
		job:     forward.Job{Egress: []forward.Egress{{Addr: a("2001:db8::1"), Block: block}}, Exposures: []forward.Exposure{ex("2001:db8::1")}},
		want: control.Lease{
			Addresses: []netip.Prefix{p("fd7a::2/112")}, Gateways: []netip.Addr{a("fd7a::1")}, DNS: []netip.Addr{a("fd7a::1")},
			PublicAddrs: []netip.Addr{a("2001:db8::1")}, Ports: [2]uint16{20000, 20255}, Exposed: []control.Exposed{cex("2001:db8::1")},
		},
	}, {
		// IPv4 flows from every address of the host (no block on it):
		// no IPv4 egress address; IPv6 from the job's own address.
		name:    "own IPv6 address",
		tunnels: tunnels,
		l:       lease.Lease{Addrs: []netip.Prefix{p("100.64.0.2/16"), p("fd00:1::6440:2/48")}},
		job:     forward.Job{Egress: []forward.Egress{{Addr: netip.IPv4Unspecified()}, {Addr: a("2001:db8:77::6440:2"), Own: true}}},
		want: control.Lease{
			Addresses: []netip.Prefix{p("100.64.0.2/16"), p("fd00:1::6440:2/48")},
			Gateways:  []netip.Addr{a("100.64.0.1"), a("fd00:1::6440:1")}, DNS: []netip.Addr{a("100.64.0.1"), a("fd00:1::6440:1")},
			PublicAddrs: []netip.Addr{a("2001:db8:77::6440:2")},
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			g := &gateway{tunnels: tt.tunnels}
			var got control.Lease
			g.describe(&got, tt.l, tt.job)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
