// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/lease"
)

// TestPlanSubnet6: the first start makes a random unique-local /48 and
// keeps it; later starts read it; --subnet6 wins; off and a non-IPv4
// subnet mean none; bad prefixes are refused.
func TestPlanSubnet6(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	cfg := Config{StateDir: dir, Subnet: netip.MustParsePrefix(DefaultSubnet)}
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
	if other, _ := planSubnet6(Config{StateDir: t.TempDir(), Subnet: cfg.Subnet}, log); other == p {
		t.Errorf("two state dirs made the same prefix %v", p)
	}
	set := netip.MustParsePrefix("fd99:1::/64")
	if got, err := planSubnet6(Config{StateDir: dir, Subnet: cfg.Subnet, Subnet6: set}, log); err != nil || got != set {
		t.Errorf("--subnet6 %v: got %v, %v", set, got, err)
	}
	if got, _ := planSubnet6(Config{StateDir: dir, Subnet: cfg.Subnet, NoIPv6: true}, log); got.IsValid() {
		t.Errorf("--subnet6 off: got %v", got)
	}
	if got, _ := planSubnet6(Config{StateDir: dir, Subnet: netip.MustParsePrefix("fd00:1::/64")}, log); got.IsValid() {
		t.Errorf("IPv6 --subnet: got %v", got)
	}
	if _, err := planSubnet6(Config{StateDir: dir, Subnet: cfg.Subnet, Subnet6: netip.MustParsePrefix("fd00::/120")}, log); err == nil {
		t.Error("--subnet6 /120: no error")
	}
	if err := os.WriteFile(filepath.Join(dir, Subnet6File), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := planSubnet6(cfg, log); err == nil || !strings.Contains(err.Error(), "remove the file") {
		t.Errorf("bad state file: %v, want an error that says how to fix it", err)
	}
}

// TestSetupDualStack: jobs get IPv6 addresses when the backend carries
// IPv6 and the host has an IPv6 egress address; without one, IPv4 only.
func TestSetupDualStack(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{Logger: log, Subnet: netip.MustParsePrefix(DefaultSubnet), Subnet6: netip.MustParsePrefix("fd00:1::/48")}
	newLeases := func() *lease.Manager {
		m, err := lease.New(cfg.Subnet, cfg.Subnet.Addr().Next(), time.Minute, 0)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	egress := netip.MustParseAddr("2001:db8::1")
	m := newLeases()
	d, err := setupDualStack(cfg, m, func() (netip.Addr, error) { return egress, nil })
	if err != nil || !d.on() || d.egress != egress || d.gw != netip.MustParseAddr("fd00:1::6440:1") || m.Prefix6() != cfg.Subnet6 {
		t.Errorf("with an IPv6 default route: %+v, %v; prefix6 %v", d, err, m.Prefix6())
	}
	m = newLeases()
	d, err = setupDualStack(cfg, m, func() (netip.Addr, error) { return netip.Addr{}, errors.New("no route") })
	if err != nil || d.on() || m.Prefix6().IsValid() {
		t.Errorf("without an IPv6 default route: %+v, %v; prefix6 %v, want IPv4 only", d, err, m.Prefix6())
	}
	// Kernel mode carries IPv6 too: with --egress-prefix6 (which needs
	// no local route there) each job gets its own address.
	m = newLeases()
	kcfg := cfg
	kcfg.Egress = EgressKernel
	kcfg.EgressPrefix6 = netip.MustParsePrefix("2001:db8:77::/96")
	d, err = setupDualStack(kcfg, m, func() (netip.Addr, error) { return netip.Addr{}, errors.New("no route") })
	if err != nil || !d.on() || d.own != kcfg.EgressPrefix6 || m.Prefix6() != cfg.Subnet6 {
		t.Errorf("kernel mode with --egress-prefix6: %+v, %v; prefix6 %v, want IPv6 with own addresses", d, err, m.Prefix6())
	}
	m = newLeases()
	kcfg.EgressPrefix6 = netip.Prefix{}
	d, err = setupDualStack(kcfg, m, func() (netip.Addr, error) { return egress, nil })
	if err != nil || !d.on() || d.egress != egress || m.Prefix6() != cfg.Subnet6 {
		t.Errorf("kernel mode with an IPv6 default route: %+v, %v; prefix6 %v, want IPv6", d, err, m.Prefix6())
	}
}
