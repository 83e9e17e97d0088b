// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

func TestPathMTUOffer(t *testing.T) {
	key, err := tunnel.NewProbeKey()
	if err != nil {
		t.Fatal(err)
	}
	routes := map[netip.Addr]int{
		netip.MustParseAddr("198.51.100.2"): 9000,
		netip.MustParseAddr("2001:db8::2"):  9000,
		netip.MustParseAddr("192.0.2.2"):    1500,
		netip.MustParseAddr("192.0.2.3"):    1400,
		netip.MustParseAddr("127.0.0.1"):    65536,
	}
	p := &pathMTU{floor: 1420, ceiling: 8940, key: key, route: func(a netip.Addr) (int, error) {
		if m, ok := routes[a]; ok {
			return m, nil
		}
		return 0, errors.New("no route")
	}}
	for _, tt := range []struct {
		remote string
		want   int
	}{
		{"198.51.100.2", 8940},
		{"2001:db8::2", 8920},
		{"192.0.2.2", 1440},
		{"192.0.2.3", 0},    // below --mtu: nothing offered
		{"127.0.0.1", 8940}, // the ceiling
		{"203.0.113.9", 0},  // no route
		{"", 0},             // no remote (a restored lease)
	} {
		var a netip.Addr
		if tt.remote != "" {
			a = netip.MustParseAddr(tt.remote)
		}
		var cl control.Lease
		p.offer(&cl, a, time.Now())
		if cl.MaxMTU != tt.want || (tt.want == 0) != (cl.MTUProbe == nil) {
			t.Errorf("offer to %q: MaxMTU %d, token %x; want %d", tt.remote, cl.MaxMTU, cl.MTUProbe, tt.want)
		}
	}
	// Kernel mode and --max-mtu equal to --mtu offer nothing.
	for _, cfg := range []struct {
		c    Config
		mode string
	}{{Config{MTU: 1420}, EgressKernel}, {Config{MTU: 1420, MaxMTU: 1420}, EgressUser}} {
		q, err := newPathMTU(cfg.c, cfg.mode)
		if err != nil {
			t.Fatal(err)
		}
		var cl control.Lease
		q.offer(&cl, netip.MustParseAddr("127.0.0.1"), time.Now())
		if cl.MaxMTU != 0 || q.key != nil {
			t.Errorf("%s with --max-mtu %d: offered %d, want nothing", cfg.mode, cfg.c.MaxMTU, cl.MaxMTU)
		}
	}
}

// TestPathMTURouteCache: a storm's joins from one node look its route up
// once per routeCacheTTL; errors are not cached; the cache stays bounded.
func TestPathMTURouteCache(t *testing.T) {
	key, err := tunnel.NewProbeKey()
	if err != nil {
		t.Fatal(err)
	}
	lookups := map[netip.Addr]int{}
	fail := true
	p := &pathMTU{floor: 1420, ceiling: 8940, key: key, route: func(a netip.Addr) (int, error) {
		lookups[a]++
		if fail && a == netip.MustParseAddr("192.0.2.9") {
			return 0, errors.New("no route")
		}
		return 9000, nil
	}}
	node := netip.MustParseAddr("198.51.100.2")
	t0 := time.Now()
	for i := range 100 {
		var cl control.Lease
		p.offer(&cl, node, t0.Add(time.Duration(i)*time.Millisecond))
		if cl.MaxMTU != 8940 {
			t.Fatalf("join %d: MaxMTU %d, want 8940", i, cl.MaxMTU)
		}
	}
	if lookups[node] != 1 {
		t.Errorf("100 joins within %v: %d route lookups, want 1", routeCacheTTL, lookups[node])
	}
	var cl control.Lease
	p.offer(&cl, node, t0.Add(routeCacheTTL))
	if lookups[node] != 2 {
		t.Errorf("a join %v later: %d route lookups, want 2", routeCacheTTL, lookups[node])
	}
	bad := netip.MustParseAddr("192.0.2.9")
	p.offer(&cl, bad, t0)
	fail = false
	cl = control.Lease{}
	p.offer(&cl, bad, t0)
	if lookups[bad] != 2 || cl.MaxMTU != 8940 {
		t.Errorf("after a failed lookup: %d lookups, MaxMTU %d; want 2, 8940 (errors are not cached)", lookups[bad], cl.MaxMTU)
	}
	for i := range routeCacheMax + 10 {
		p.offer(&cl, netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), t0)
	}
	if n := len(p.routes); n > routeCacheMax {
		t.Errorf("cache holds %d routes, want at most %d", n, routeCacheMax)
	}
}

func TestCheckMaxMTU(t *testing.T) {
	for _, tt := range []struct {
		mtu, max int
		ok       bool
	}{{1420, 0, true}, {1420, 1420, true}, {1420, 8940, true}, {1420, 1400, false}, {1420, 70000, false}} {
		if err := checkMaxMTU(tt.mtu, tt.max); (err == nil) != tt.ok {
			t.Errorf("checkMaxMTU(%d, %d) = %v, want ok %v", tt.mtu, tt.max, err, tt.ok)
		}
	}
}
