// SPDX-License-Identifier: MIT

package policy

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

func explainPolicy() *Policy {
	return &Policy{Default: Deny, Rules: []Rule{
		{Name: "no-smtp", Action: Deny, Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}}},
		{Name: "cms-storage", Action: Allow, To: []netip.Prefix{mp("10.1.0.0/16")}, Tokens: []string{"cms"}},
		{Name: "web", Action: Allow, Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 443, Hi: 443}, {Lo: 80, Hi: 80}}},
		{Name: "dns", Action: Allow, Proto: ProtoUDP, To: []netip.Prefix{mp("192.0.2.53/32")}, Ports: []portblock.Range{{Lo: 53, Hi: 53}}},
	}}
}

func TestExplain(t *testing.T) {
	p := explainPolicy()
	tests := []struct {
		name  string
		f     Flow
		want  Verdict
		steps []string // substrings, one per step
	}{
		{"web", Flow{Token: "atlas", Proto: ProtoTCP, Dst: netip.MustParseAddr("198.51.100.7"), Port: 443}, Verdict{Allow, "web"},
			[]string{`"no-smtp" does not match: port 443 is not in 25`, `"cms-storage" does not match: it is for tokens "cms", the job has token "atlas"`, `rule "web" decides: allow, as it names no destination (every one), protocol tcp, port 443 in 443,80`}},
		{"smtp", Flow{Token: "cms", Proto: ProtoTCP, Dst: netip.MustParseAddr("198.51.100.7"), Port: 25}, Verdict{Deny, "no-smtp"},
			[]string{`rule "no-smtp" decides: deny`}},
		{"private by name", Flow{Token: "cms", Proto: ProtoTCP, Dst: netip.MustParseAddr("10.1.2.3"), Port: 1094}, Verdict{Allow, "cms-storage"},
			[]string{"does not match", `rule "cms-storage" decides: allow, as 10.1.2.3 is in 10.1.0.0/16, token "cms" listed`}},
		{"private not named", Flow{Token: "atlas", Proto: ProtoTCP, Dst: netip.MustParseAddr("10.9.2.3"), Port: 443}, Verdict{Deny, RulePrivate},
			[]string{"does not match", "does not match", `rule "web" matches but does not decide: an allow rule opens 10.0.0.0/8 (private-use (RFC 1918), builtin-private) only if it names that range`, "it is for udp, the flow is tcp", "built-in builtin-private denies 10.9.2.3"}},
		{"floor", Flow{Proto: ProtoTCP, Dst: netip.MustParseAddr("127.0.0.1"), Port: 443}, Verdict{Deny, RuleFloor},
			[]string{"127.0.0.1 is in 127.0.0.0/8 (loopback (RFC 1122)), which no rule can open"}},
		{"default", Flow{Proto: ProtoICMP, Dst: netip.MustParseAddr("198.51.100.7")}, Verdict{Deny, RuleDefault},
			[]string{"it is for tcp, the flow is icmp", "is for tokens", "it is for tcp, the flow is icmp", "it is for udp, the flow is icmp", "the policy's default (deny) decides"}},
		{"no destination", Flow{Proto: ProtoUDP, Dst: netip.MustParseAddr("198.51.100.7"), Port: 53}, Verdict{Deny, RuleDefault},
			[]string{"it is for tcp", "is for tokens", "it is for tcp", `"dns" does not match: 198.51.100.7 is in none of its destinations 192.0.2.53/32`, "default (deny)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := p.Explain(tt.f)
			if e.Verdict != tt.want {
				t.Errorf("verdict %v, want %v", e.Verdict, tt.want)
			}
			if len(e.Steps) != len(tt.steps) {
				t.Fatalf("got %d steps %q, want %d", len(e.Steps), e.Steps, len(tt.steps))
			}
			for i, w := range tt.steps {
				if !strings.Contains(e.Steps[i], w) {
					t.Errorf("step %d: got %q, want %q in it", i, e.Steps[i], w)
				}
			}
		})
	}
}

// TestExplainAgreesWithDecide keeps Explain's walk in step with Decide's
// over destinations in and around every built-in range, with and without
// tokens, ports and the host flag.
func TestExplainAgreesWithDecide(t *testing.T) {
	p := explainPolicy()
	var dsts []netip.Addr
	for _, r := range ranges {
		dsts = append(dsts, r.Prefix.Addr(), r.Prefix.Addr().Next(), r.Prefix.Addr().Prev())
	}
	dsts = append(dsts, netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("64:ff9b::a01:203"))
	tunnels := []netip.Prefix{mp("100.64.0.0/16")}
	n := 0
	for _, dst := range dsts {
		if !dst.IsValid() {
			continue
		}
		for _, tok := range []string{"", "cms", "atlas"} {
			for _, proto := range []Proto{ProtoTCP, ProtoUDP, ProtoICMP} {
				for _, port := range []uint16{0, 25, 53, 443} {
					for _, host := range []bool{false, true} {
						f := Flow{Token: tok, Proto: proto, Dst: dst, Port: port, Host: host, Tunnels: tunnels}
						if got, want := p.Explain(f).Verdict, p.Decide(f); got != want {
							t.Fatalf("%+v: Explain says %v, Decide %v", f, got, want)
						}
						n++
					}
				}
			}
		}
	}
	t.Logf("%d flows agree", n)
}
