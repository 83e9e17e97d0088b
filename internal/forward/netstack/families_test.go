// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/test/topology"
)

var (
	gwPrefix6 = netip.MustParsePrefix("fd00:a1::6440:1/48")
	jobAddr6  = netip.MustParseAddr("fd00:a1::6440:2")
)

// addJobIPv6 gives the pair's job stack jobAddr6 and an IPv6 default route.
func (p *pair) addJobIPv6(t *testing.T) {
	t.Helper()
	pa := tcpip.ProtocolAddress{
		Protocol:          ipv6.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom16(jobAddr6.As16()), PrefixLen: 48},
	}
	if err := p.job.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
		t.Fatalf("job AddProtocolAddress: %v", err)
	}
	p.job.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}, {Destination: header.IPv6EmptySubnet, NIC: 1}})
}

func (p *pair) jobDialTCP6(ctx context.Context, dst string) (*gonet.TCPConn, error) {
	return gonet.DialContextTCP(ctx, p.job, fullAddr(netip.MustParseAddrPort(dst)), ipv6.ProtocolNumber)
}

// TestBothFamilies: a job's IPv6 flows are dialled as tcp6 under the job's
// policy token and its flow limits (shared with its IPv4 flows), and are
// attributed to the job in the flow table; IPv6 rules, the floor and the
// IPv6 tunnel prefix apply; RemoveJob forgets the IPv6 address.
func TestBothFamilies(t *testing.T) {
	checkGoroutines(t)
	tb := flows.New(flows.Config{})
	p := newPair(t, Config{Addrs: []netip.Prefix{gwPrefix, gwPrefix6}, Flows: tb, HostAddrs: func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("2001:db8:ff::1")}, nil
	}})
	p.addJobIPv6(t)
	ln := listenTCP(t, func(c net.Conn) { c.Write([]byte("hi")); time.Sleep(300 * time.Millisecond); c.Close() })
	for _, d := range []string{"[2001:db8::7]:80", "[2001:db8::7]:25", "[2001:db8:1::9]:80", "198.51.100.7:80"} {
		p.dial.route(d, ln)
	}
	if err := p.s.AddJob(testJob("L", jobAddr, netip.MustParseAddr("fd00:b2::2"))); err == nil {
		t.Error("AddJob with an IPv6 address outside the IPv6 tunnel prefix: no error")
	}
	if p.s.jobOf(jobAddr) != nil {
		t.Error("a refused AddJob left the job's IPv4 side behind")
	}
	if err := p.s.AddJob(forward.Job{ID: "L", Addrs: []netip.Addr{jobAddr, jobAddr6}, Ref: jobs.Ref{JobID: "j1", Token: "other"}}); err != nil {
		t.Fatal(err)
	}
	pol := &policy.Policy{Rules: []policy.Rule{
		{Name: "no-smtp6", Action: policy.Deny, To: []netip.Prefix{netip.MustParsePrefix("2001:db8::/48")}, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}}},
		{Name: "lab6", Action: policy.Deny, To: []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")}, Tokens: []string{"other"}},
	}}
	if err := p.s.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	dial := func(dst string) (*gonet.TCPConn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return p.jobDialTCP6(ctx, dst)
	}
	for _, tc := range []struct {
		dst string
		ok  bool
	}{
		{"[2001:db8::7]:80", true},
		{"[2001:db8::7]:25", false},        // no-smtp6
		{"[2001:db8:1::9]:80", false},      // lab6: the job's token, by its IPv6 address
		{"[fd00:a1::6440:3]:80", false},    // another job's IPv6 tunnel address: the floor
		{"[2001:db8:ff::1]:80", false},     // the gateway host
		{"[::ffff:127.0.0.1]:80", false},   // IPv4-mapped loopback
		{"[64:ff9b::a9fe:a9fe]:80", false}, // NAT64 image of the metadata address
		{"[fd00:a1::6440:1]:80", false},    // the gateway's own IPv6 tunnel address (no service)
	} {
		c, err := dial(tc.dst)
		if c != nil {
			c.Close()
		}
		if (err == nil) != tc.ok {
			t.Errorf("dial %s: %v, want allowed %v", tc.dst, err, tc.ok)
		}
	}
	for _, c := range p.dial.Calls() {
		if c != "tcp6 [2001:db8::7]:80" {
			t.Errorf("dialled %s", c)
		}
	}
	// One flow at most: an open IPv4 flow refuses the job's IPv6 one.
	if err := p.s.SetJobLimits("L", limits.Job{MaxFlows: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c4, err := p.jobDialTCP(ctx, "198.51.100.7:80")
	if err != nil {
		t.Fatalf("dial over IPv4: %v", err)
	}
	if c, err := dial("[2001:db8::7]:80"); err == nil {
		c.Close()
		t.Error("IPv6 flow beyond the job's MaxFlows 1 (one IPv4 flow open): allowed")
	}
	c4.Close()
	var seen6 bool
	topology.Poll(3*time.Second, func() bool {
		for _, r := range append(tb.Active(flows.Filter{}), tb.Recent(flows.Filter{})...) {
			if r.Src != "" && netip.MustParseAddrPort(r.Src).Addr() == jobAddr6 {
				seen6 = true
				if r.JobID != "j1" || r.JobAddr != jobAddr.String() {
					t.Errorf("IPv6 flow record %+v: want job j1 at %v", r, jobAddr)
				}
			}
		}
		return seen6
	})
	if !seen6 {
		t.Error("no flow record from the job's IPv6 address")
	}
	p.s.RemoveJob("L")
	if got := p.s.jobOf(jobAddr6); got != nil {
		t.Errorf("after RemoveJob, jobOf(%v) = %+v, want none", jobAddr6, got)
	}
}
