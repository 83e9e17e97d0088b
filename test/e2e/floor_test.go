// SPDX-License-Identifier: MIT

package e2e

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-vpn/airlock/test/topology"
)

// Destinations in the ranges the built-in floor protects beyond RFC 1918
// and link-local (policy.Builtin): shared address space 100.64.0.0/10
// (outside the gateway's tunnel subnet 100.64.0.0/16), the cloud metadata
// endpoint in it, and 192.0.0.0/24. floorDestinations puts them on inet
// and routes them there from dmz, so that a job would reach them were it
// not for the floor.
var (
	sharedAddr    = netip.MustParseAddr("100.100.0.10")
	aliMetaAddr   = netip.MustParseAddr("100.100.100.200")
	ietfProtoAddr = netip.MustParseAddr("192.0.0.170")
	floorAddrs    = []netip.Addr{sharedAddr, aliMetaAddr, ietfProtoAddr}
)

// floorDestinations adds floorAddrs to inet (routed from dmz), starts a
// greeting server on every inet address at a new port, checks dmz
// reaches each, and returns the port.
func floorDestinations(t *testing.T, tp *topology.Topology) int {
	t.Helper()
	for _, a := range floorAddrs {
		mustCmd(t, "ip", "-n", tp.INET, "addr", "add", a.String()+"/32", "dev", topology.IfINETToDMZ)
		mustCmd(t, "ip", "-n", tp.DMZ, "route", "add", a.String()+"/32", "via", tp.INETAddr.String())
	}
	port := tp.Port()
	tp.StartTCPListener(t, tp.INET, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port)))
	for _, a := range floorAddrs {
		if ap := netip.AddrPortFrom(a, uint16(port)); !tp.TCPCheck(t, tp.DMZ, nil, ap) {
			t.Fatalf("%v does not answer from dmz: the test's destinations are not set up", ap)
		}
	}
	return port
}

// IPv6 on the dmz–inet link for TestFloorNAT64, and the NAT64 forms
// (64:ff9b::/96) of floor destinations that inet answers on, as if a NAT64
// gateway sat on that path.
var (
	dmzAddr6  = netip.MustParseAddr("2001:db8:1::1")
	inetAddr6 = netip.MustParseAddr("2001:db8:1::2")
	// nat64Open is the NAT64 form of inet's 203.0.113.2 (documentation
	// space: allowed), the control that shows the path works.
	nat64Open  = netip.MustParseAddr("64:ff9b::cb00:7102")
	nat64Floor = []netip.Addr{
		netip.MustParseAddr("64:ff9b::a9fe:a9fe"), // 169.254.169.254
		netip.MustParseAddr("64:ff9b::6464:a"),    // 100.100.0.10
		netip.MustParseAddr("64:ff9b::6464:64c8"), // 100.100.100.200
		netip.MustParseAddr("64:ff9b::c000:aa"),   // 192.0.0.170
		netip.MustParseAddr("64:ff9b::a00:1"),     // 10.0.0.1
	}
)

// TestFloorNAT64 runs a user-mode gateway (each TCP stack) with an IPv6
// tunnel subnet, so that jobs speak IPv6, and dmz routes 64:ff9b::/96 to
// inet, which answers on the NAT64 forms of floor destinations: a job
// reaches the NAT64 form of a documentation address but none of the floor
// ones; a config rule that names the NAT64 form of 100.100.0.10 opens it
// for the jobs of one token only. Kernel mode's refusal of embedded forms
// is checked by TestAirlock/kernel/FloorIPv4Embedded and, per
// address, by the conformance suite and TestPolicy6MatchesDecide.
func TestFloorNAT64(t *testing.T) {
	for _, mode := range []string{modeUser, modeUserNetstack} {
		t.Run(mode, func(t *testing.T) { testFloorNAT64(t, mode) })
	}
}

// nat64Named is the NAT64 form of 100.100.0.10 that TestFloorNAT64's
// config opens for token lab.
var nat64Named = netip.MustParseAddr("64:ff9b::6464:a")

func testFloorNAT64(t *testing.T, mode string) {
	u := topology.EnsureUser(t)
	dir := topology.TempDir(t)
	if err := os.Chown(dir, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(conf, []byte("version = 1\n[[policy.rule]]\nname = \"lab-nat64\"\naction = \"allow\"\nto = [\""+
		nat64Named.String()+"\"]\ntokens = [\"lab\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var port int
	e := newEnvHook(t, mode, nil, func(e *env) []string {
		tp := e.tp
		// The topology turns IPv6 off; on for this link only.
		mustCmd(t, "ip", "netns", "exec", tp.DMZ, "sysctl", "-q", "-w", "net.ipv6.conf."+topology.IfDMZToINET+".disable_ipv6=0")
		mustCmd(t, "ip", "netns", "exec", tp.INET, "sysctl", "-q", "-w", "net.ipv6.conf."+topology.IfINETToDMZ+".disable_ipv6=0")
		mustCmd(t, "ip", "-n", tp.DMZ, "addr", "add", dmzAddr6.String()+"/64", "dev", topology.IfDMZToINET, "nodad")
		mustCmd(t, "ip", "-n", tp.INET, "addr", "add", inetAddr6.String()+"/64", "dev", topology.IfINETToDMZ, "nodad")
		for _, a := range append([]netip.Addr{nat64Open}, nat64Floor...) {
			mustCmd(t, "ip", "-n", tp.INET, "addr", "add", a.String()+"/128", "dev", topology.IfINETToDMZ, "nodad")
		}
		mustCmd(t, "ip", "-n", tp.DMZ, "route", "add", "64:ff9b::/96", "via", inetAddr6.String())
		port = tp.Port()
		tp.StartTCPListener(t, tp.INET, netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(port)))
		for _, a := range append([]netip.Addr{nat64Open}, nat64Floor...) {
			if ap := netip.AddrPortFrom(a, uint16(port)); !tp.TCPCheck(t, tp.DMZ, nil, ap) {
				t.Fatalf("%v does not answer from dmz: the test's destinations are not set up", ap)
			}
		}
		// Jobs get IPv6 addresses; their flows leave from dmz's IPv6
		// address.
		return []string{"--subnet", "fd7a:a1::/120", "--egress-addr", dmzAddr6.String(), "--config", conf}
	})
	lab := e.createToken(t, "lab")
	open := netip.AddrPortFrom(nat64Open, uint16(port))
	if code, out, stderr := e.run(t, e.peer, "tcpget", open.String()); code != 0 || out != "hello\n" {
		t.Fatalf("job to %v (NAT64 of a documentation address): exit %d, %q, want hello%s", open, code, out, e.diag(stderr))
	}
	for _, a := range nat64Floor {
		ap := netip.AddrPortFrom(a, uint16(port))
		if code, out, stderr := e.run(t, e.peer, "tcpget", ap.String()); code == 0 {
			t.Errorf("job reached %v (%q); want it refused: it embeds a floor address%s", ap, out, e.diag(stderr))
		}
	}
	named := netip.AddrPortFrom(nat64Named, uint16(port))
	if code, out, stderr := e.runWith(t, runOpts{token: lab}, e.peer, "tcpget", named.String()); code != 0 || out != "hello\n" {
		t.Errorf("job of token lab to %v (its allow rule names it): exit %d, %q, want hello%s", named, code, out, e.diag(stderr))
	}
	other := netip.AddrPortFrom(nat64Floor[0], uint16(port))
	if code, out, _ := e.runWith(t, runOpts{token: lab}, e.peer, "tcpget", other.String()); code == 0 {
		t.Errorf("job of token lab reached %v (%q); its rule names only %v", other, out, nat64Named)
	}
}
