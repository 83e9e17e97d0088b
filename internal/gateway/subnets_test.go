// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// TestPlanSubnet6: the first start makes a random unique-local /48 and
// keeps it; later starts read it; --subnet6 wins; off and a non-IPv4
// subnet mean none; bad prefixes are refused.
func TestPlanSubnet6(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	v4 := netip.MustParsePrefix(DefaultSubnet)
	cfg := Config{StateDir: dir, Subnets: []netip.Prefix{v4}}
	p, err := planSubnet6(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if p.Bits() != 48 || !netip.MustParsePrefix("fd00::/8").Contains(p.Addr()) {
		t.Errorf("made %v, want a /48 in fd00::/8", p)
	}
	b, err := os.ReadFile(filepath.Join(dir, Subnet6File))
	if err != nil || strings.TrimSpace(string(b)) != p.String() {
		t.Errorf("state file %q, %v; want %v", b, err, p)
	}
	if again, err := planSubnet6(cfg, log); err != nil || again != p {
		t.Errorf("second start: %v, %v; want the kept %v", again, err, p)
	}
	if other, _ := planSubnet6(Config{StateDir: t.TempDir(), Subnets: cfg.Subnets}, log); other == p {
		t.Errorf("two state dirs made the same prefix %v", p)
	}
	set := netip.MustParsePrefix("fd99:1::/64")
	if got, err := planSubnet6(Config{StateDir: dir, Subnets: []netip.Prefix{v4, set}}, log); err != nil || got != set {
		t.Errorf("--subnet6 %v: got %v, %v", set, got, err)
	}
	if got, _ := planSubnet6(Config{StateDir: dir, Subnets: cfg.Subnets, NoIPv6: true}, log); got.IsValid() {
		t.Errorf("--subnet6 off: got %v", got)
	}
	if got, _ := planSubnet6(Config{StateDir: dir, Subnets: []netip.Prefix{netip.MustParsePrefix("fd00:1::/64")}}, log); got.IsValid() {
		t.Errorf("IPv6 --subnet: got %v", got)
	}
	if _, err := planSubnet6(Config{StateDir: dir, Subnets: []netip.Prefix{v4, netip.MustParsePrefix("fd00::/120")}}, log); err == nil {
		t.Error("--subnet6 /120: no error")
	}
	if err := os.WriteFile(filepath.Join(dir, Subnet6File), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := planSubnet6(cfg, log); err == nil || !strings.Contains(err.Error(), "remove the file") {
		t.Errorf("bad state file: %v, want an error that says how to fix it", err)
	}
}

// TestPlanEgressIPv6: the one egress planner gives jobs IPv6 addresses
// when the host has an IPv6 egress address; without one, IPv4 only.
func TestPlanEgressIPv6(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	subnet6 := netip.MustParsePrefix("fd00:1::/48")
	cfg := Config{Logger: log, Subnets: []netip.Prefix{netip.MustParsePrefix(DefaultSubnet), subnet6}}
	newLeases := func() *lease.Manager {
		m, err := lease.New(cfg.subnet(), cfg.subnet().Addr().Next(), time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	egress6 := netip.MustParseAddr("2001:db8::1")
	plan := func(c Config, m *lease.Manager, source6 func() (netip.Addr, error)) (egress, error) {
		env := egressEnv{
			hostRange: func() (portblock.Range, error) { return portblock.Range{Lo: 32768, Hi: 60999}, nil },
			defaultSource: func(f *ipfamily.Family) (netip.Addr, error) {
				if f == ipfamily.V6 {
					return source6()
				}
				return netip.MustParseAddr("203.0.113.1"), nil
			},
		}
		e, err := planEgress(c, env)
		if err == nil {
			err = e.applyPrefix6(log, m)
		}
		return e, err
	}
	m := newLeases()
	e, err := plan(cfg, m, func() (netip.Addr, error) { return egress6, nil })
	if err != nil || e.publicOf[ipfamily.V6.Index] != egress6 || m.GatewayAddr(ipfamily.V6) != netip.MustParseAddr("fd00:1::6440:1") || m.Prefix(ipfamily.V6) != subnet6 {
		t.Errorf("with an IPv6 default route: %+v, %v; prefix6 %v", e, err, m.Prefix(ipfamily.V6))
	}
	if got := tunnelAddrs(m); len(got) != 2 || got[1] != netip.MustParsePrefix("fd00:1::6440:1/48") {
		t.Errorf("tunnel addresses %v, want the IPv6 one beside the IPv4 one", got)
	}
	m = newLeases()
	e, err = plan(cfg, m, func() (netip.Addr, error) { return netip.Addr{}, errors.New("no route") })
	if err != nil || e.publicOf[ipfamily.V6.Index].IsValid() || m.Prefix(ipfamily.V6).IsValid() {
		t.Errorf("without an IPv6 default route: %+v, %v; prefix6 %v, want IPv4 only", e, err, m.Prefix(ipfamily.V6))
	}
	if got := tunnelAddrs(m); len(got) != 1 {
		t.Errorf("tunnel addresses %v, want the IPv4 one", got)
	}
	// Kernel mode carries IPv6 too: with --egress-prefix (which needs
	// no local route there) each job gets its own address.
	m = newLeases()
	kcfg := cfg
	kcfg.Egress = EgressKernel
	kcfg.EgressPrefix6 = netip.MustParsePrefix("2001:db8:77::/96")
	e, err = plan(kcfg, m, func() (netip.Addr, error) { return netip.Addr{}, errors.New("no route") })
	if err != nil || e.own != kcfg.EgressPrefix6 || m.Prefix(ipfamily.V6) != subnet6 {
		t.Errorf("kernel mode with --egress-prefix: %+v, %v; prefix6 %v, want IPv6 with own addresses", e, err, m.Prefix(ipfamily.V6))
	}
	m = newLeases()
	kcfg.EgressPrefix6 = netip.Prefix{}
	e, err = plan(kcfg, m, func() (netip.Addr, error) { return egress6, nil })
	if err != nil || e.publicOf[ipfamily.V6.Index] != egress6 || m.Prefix(ipfamily.V6) != subnet6 {
		t.Errorf("kernel mode with an IPv6 default route: %+v, %v; prefix6 %v, want IPv6", e, err, m.Prefix(ipfamily.V6))
	}
}

// TestSetSubnets: the tunnel prefixes are put IPv4 first and masked,
// DefaultSubnet without any; two of one family or an IPv4-mapped one are
// refused.
func TestSetSubnets(t *testing.T) {
	for _, tt := range []struct {
		in, want []string
		ok       bool
	}{
		{nil, []string{DefaultSubnet}, true},
		{[]string{"fd00:1::5/48", "10.8.0.9/16"}, []string{"10.8.0.0/16", "fd00:1::/48"}, true},
		{[]string{"fd00:1::/48"}, []string{"fd00:1::/48"}, true},
		{[]string{"10.8.0.0/16", "10.9.0.0/16"}, nil, false},
		{[]string{"::ffff:10.8.0.0/112"}, nil, false},
	} {
		var c Config
		for _, s := range tt.in {
			c.Subnets = append(c.Subnets, netip.MustParsePrefix(s))
		}
		err := c.setSubnets()
		if !tt.ok {
			if err == nil {
				t.Errorf("%v: got %v, want an error", tt.in, c.Subnets)
			}
			continue
		}
		var want []netip.Prefix
		for _, s := range tt.want {
			want = append(want, netip.MustParsePrefix(s))
		}
		if err != nil || !slices.Equal(c.Subnets, want) {
			t.Errorf("%v: got %v, %v; want %v", tt.in, c.Subnets, err, want)
		}
	}
}
