// SPDX-License-Identifier: MIT

package policy

import (
	"net/netip"
	"testing"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestDecide(t *testing.T) {
	p := &Policy{
		Default: Allow,
		Rules: []Rule{
			{Name: "no-smtp", Action: Deny, Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}, {Lo: 465, Hi: 465}}},
			{Name: "cms-xrootd", Action: Allow, To: pfx("10.1.0.0/16"), Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 1094, Hi: 1095}}, Tokens: []string{"cms"}},
			{Name: "metadata", Action: Allow, To: pfx("169.254.169.254/32"), Tokens: []string{"cloud"}},
			{Name: "host-web", Action: Allow, To: pfx("203.0.113.1/32"), Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 8080, Hi: 8080}}},
			{Name: "wide", Action: Allow, To: pfx("0.0.0.0/0", "::/0")},
			{Name: "never", Action: Deny, To: pfx("198.51.100.0/24")},
		},
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	tests := []struct {
		name string
		f    Flow
		want Verdict
	}{
		{"public allowed by wide", Flow{Proto: ProtoTCP, Dst: a("192.0.2.7"), Port: 443}, Verdict{Allow, "wide"}},
		{"smtp denied", Flow{Proto: ProtoTCP, Dst: a("192.0.2.7"), Port: 25}, Verdict{Deny, "no-smtp"}},
		{"smtp udp not matched", Flow{Proto: ProtoUDP, Dst: a("192.0.2.7"), Port: 25}, Verdict{Allow, "wide"}},
		{"first match wins over later deny", Flow{Proto: ProtoTCP, Dst: a("198.51.100.9"), Port: 80}, Verdict{Allow, "wide"}},
		{"private not lifted by wide", Flow{Proto: ProtoTCP, Dst: a("10.2.3.4"), Port: 80}, Verdict{Deny, RulePrivate}},
		{"private lifted for cms", Flow{Token: "cms", Proto: ProtoTCP, Dst: a("10.1.3.4"), Port: 1094}, Verdict{Allow, "cms-xrootd"}},
		{"private not for others", Flow{Token: "atlas", Proto: ProtoTCP, Dst: a("10.1.3.4"), Port: 1094}, Verdict{Deny, RulePrivate}},
		{"private other port", Flow{Token: "cms", Proto: ProtoTCP, Dst: a("10.1.3.4"), Port: 22}, Verdict{Deny, RulePrivate}},
		{"ula", Flow{Proto: ProtoUDP, Dst: a("fd00::1"), Port: 53}, Verdict{Deny, RulePrivate}},
		{"metadata", Flow{Proto: ProtoTCP, Dst: a("169.254.169.254"), Port: 80}, Verdict{Deny, RuleMetadata}},
		{"metadata for cloud", Flow{Token: "cloud", Proto: ProtoTCP, Dst: a("169.254.169.254"), Port: 80}, Verdict{Allow, "metadata"}},
		{"link-local v6", Flow{Proto: ProtoICMP, Dst: a("fe80::1")}, Verdict{Deny, RuleLinkLocal}},
		{"host", Flow{Proto: ProtoTCP, Dst: a("192.0.2.1"), Port: 22, Host: true}, Verdict{Deny, RuleHost}},
		{"host named", Flow{Proto: ProtoTCP, Dst: a("203.0.113.1"), Port: 8080, Host: true}, Verdict{Allow, "host-web"}},
		{"host named other port", Flow{Proto: ProtoTCP, Dst: a("203.0.113.1"), Port: 22, Host: true}, Verdict{Deny, RuleHost}},
		{"loopback floor", Flow{Proto: ProtoTCP, Dst: a("127.0.0.1"), Port: 80}, Verdict{Deny, RuleFloor}},
		{"mapped loopback floor", Flow{Proto: ProtoTCP, Dst: a("::ffff:127.0.0.1"), Port: 80}, Verdict{Deny, RuleFloor}},
		{"multicast floor", Flow{Proto: ProtoUDP, Dst: a("239.1.1.1"), Port: 80}, Verdict{Deny, RuleFloor}},
		{"broadcast floor", Flow{Proto: ProtoUDP, Dst: a("255.255.255.255"), Port: 67}, Verdict{Deny, RuleFloor}},
		{"zero net floor", Flow{Proto: ProtoTCP, Dst: a("0.1.2.3"), Port: 80}, Verdict{Deny, RuleFloor}},
		{"icmp ignores port rules", Flow{Proto: ProtoICMP, Dst: a("192.0.2.7")}, Verdict{Allow, "wide"}},
	}
	for _, tc := range tests {
		if got := p.Decide(tc.f); got != tc.want {
			t.Errorf("%s: Decide(%+v) = %+v, want %+v", tc.name, tc.f, got, tc.want)
		}
	}
}

func TestDecideDefault(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.7")
	for _, tc := range []struct {
		p    Policy
		want Verdict
	}{
		{Policy{}, Verdict{Allow, RuleDefault}},
		{Policy{Default: Deny}, Verdict{Deny, RuleDefault}},
		{Policy{Default: Deny, Rules: []Rule{{Name: "web", Action: Allow, Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 80, Hi: 80}, {Lo: 443, Hi: 443}}}}}, Verdict{Allow, "web"}},
		{Policy{Default: Allow, Rules: []Rule{{Name: "only-b", Action: Deny, Tokens: []string{"b"}}}}, Verdict{Allow, RuleDefault}},
	} {
		if got := tc.p.Decide(Flow{Token: "a", Proto: ProtoTCP, Dst: a, Port: 443}); got != tc.want {
			t.Errorf("%+v: got %+v, want %+v", tc.p, got, tc.want)
		}
	}
	// The default never opens protected ranges.
	p := Policy{Default: Allow}
	if got := p.Decide(Flow{Proto: ProtoTCP, Dst: netip.MustParseAddr("192.168.1.1"), Port: 80}); got != (Verdict{Deny, RulePrivate}) {
		t.Errorf("default allow to 192.168.1.1: %+v, want builtin-private deny", got)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Rule
	}{
		{"unmasked", Rule{Name: "a", To: pfx("10.1.2.3/8")}},
		{"icmp ports", Rule{Name: "a", Proto: ProtoICMP, Ports: []portblock.Range{{Lo: 1, Hi: 2}}}},
		{"port 0", Rule{Name: "a", Ports: []portblock.Range{{Lo: 0, Hi: 10}}}},
		{"reversed", Rule{Name: "a", Ports: []portblock.Range{{Lo: 10, Hi: 5}}}},
		{"reserved", Rule{Name: "builtin-x"}},
		{"default", Rule{Name: "default"}},
		{"empty name", Rule{}},
		{"bad name", Rule{Name: "a b"}},
	} {
		p := Policy{Rules: []Rule{tc.r}}
		if err := p.Validate(); err == nil {
			t.Errorf("%s: Validate(%+v) = nil, want an error", tc.name, tc.r)
		}
	}
	dup := Policy{Rules: []Rule{{Name: "x"}, {Name: "x"}}}
	if err := dup.Validate(); err == nil {
		t.Error("duplicate names: want an error")
	}
}

func TestExposure(t *testing.T) {
	var none *Exposure
	if !none.Allowed("x", ProtoTCP, 80) {
		t.Error("nil Exposure must allow everything")
	}
	e := &Exposure{Rules: []ExposeRule{
		{Tokens: []string{"web"}, Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 8000, Hi: 8999}}},
		{Proto: ProtoUDP, Ports: []portblock.Range{{Lo: 5000, Hi: 5000}}},
	}}
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tok   string
		proto Proto
		port  uint16
		want  bool
	}{
		{"web", ProtoTCP, 8080, true},
		{"web", ProtoTCP, 9000, false},
		{"other", ProtoTCP, 8080, false},
		{"other", ProtoUDP, 5000, true},
		{"web", ProtoUDP, 8080, false},
	} {
		if got := e.Allowed(tc.tok, tc.proto, tc.port); got != tc.want {
			t.Errorf("Allowed(%q, %v, %d) = %v, want %v", tc.tok, tc.proto, tc.port, got, tc.want)
		}
	}
	if (&Exposure{}).Allowed("x", ProtoTCP, 80) {
		t.Error("empty Exposure must allow nothing")
	}
}

func TestCounters(t *testing.T) {
	var c Counters
	c.Inc("a")
	c.Inc("a")
	c.Inc(RuleHost)
	got := c.Snapshot()
	if got["a"] != 2 || got[RuleHost] != 1 || len(got) != 2 {
		t.Errorf("Snapshot = %v", got)
	}
}

func TestDecideAllocs(t *testing.T) {
	p := &Policy{Rules: []Rule{{Name: "a", Action: Deny, Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}}, Tokens: []string{"x"}}}}
	f := Flow{Token: "x", Proto: ProtoTCP, Dst: netip.MustParseAddr("192.0.2.1"), Port: 25}
	if n := testing.AllocsPerRun(100, func() { p.Decide(f) }); n != 0 {
		t.Errorf("Decide allocates %v times", n)
	}
}
