// SPDX-License-Identifier: MIT

package policy

import (
	"net/netip"
	"testing"
)

// TestDecideTunnel6: the floor closes the IPv6 tunnel prefix like the IPv4
// one, even under an allow rule that names it; IPv6 rules decide IPv6
// flows.
func TestDecideTunnel6(t *testing.T) {
	p := &Policy{Rules: []Rule{
		{Name: "ula", Action: Allow, To: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}},
		{Name: "no-v6-ssh", Action: Deny, To: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}, Proto: ProtoTCP, Ports: []PortRange{{Lo: 22, Hi: 22}}},
	}}
	tun6 := netip.MustParsePrefix("fd12:3456:789a::/48")
	for _, tc := range []struct {
		dst  string
		port uint16
		want Verdict
	}{
		{"fd12:3456:789a::6440:2", 80, Verdict{Deny, RuleFloor}},
		{"fd99::1", 80, Verdict{Allow, "ula"}},
		{"2001:db8::5", 22, Verdict{Deny, "no-v6-ssh"}},
		{"2001:db8::5", 443, Verdict{Allow, RuleDefault}},
	} {
		got := p.Decide(Flow{Proto: ProtoTCP, Dst: netip.MustParseAddr(tc.dst), Port: tc.port, Tunnel: netip.MustParsePrefix("100.64.0.0/16"), Tunnel6: tun6})
		if got != tc.want {
			t.Errorf("Decide(%s:%d) = %v, want %v", tc.dst, tc.port, got, tc.want)
		}
	}
}
