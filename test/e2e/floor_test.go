package e2e

import (
	"net/netip"
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

// checkFloorDenied runs, in the env's mode without a config file, a job
// against each floor destination: every connection must be refused (the
// same servers answer dmz, see floorDestinations).
func checkFloorDenied(t *testing.T, e *env) {
	port := floorDestinations(t, e.tp)
	for _, a := range floorAddrs {
		ap := netip.AddrPortFrom(a, uint16(port))
		if code, out, stderr := e.run(t, e.peer, "tcpget", ap.String()); code == 0 {
			t.Errorf("job reached %v (%q) with no config; want it refused by the built-in floor%s", ap, out, e.diag(stderr))
		}
	}
}
