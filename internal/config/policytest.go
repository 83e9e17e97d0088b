// SPDX-License-Identifier: MIT

package config

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlock-vpn/airlock/internal/policy"
)

// Policy tests: `[[policy.test]]` entries say what the policy must allow
// and deny for a token, as Tailscale's ACL tests do. They run whenever
// the file is loaded — at the gateway's start, at every reload, by
// `airlock gateway --check` and `airlock policy explain` — and a file
// whose tests fail is refused like any other invalid file, so an edit
// that opens or closes more than the admin meant never takes effect.
//
// They run without the gateway's own addresses and tunnel subnets, which
// the file does not know: a destination that is the gateway host itself
// is denied by the built-in builtin-host at run time whatever a test
// says, so tests should not name the gateway's addresses.

// PolicyTest is one [[policy.test]] entry.
type PolicyTest struct {
	// Token is the token name the job joined with ("" for one that no
	// rule names).
	Token string
	Proto policy.Proto
	// Allow and Deny are the destinations the policy must allow and deny.
	Allow, Deny []netip.AddrPort
}

// filePolicyTest is a [[policy.test]] as written.
type filePolicyTest struct {
	Token string   `toml:"token"`
	Proto string   `toml:"proto"`
	Allow []string `toml:"allow"`
	Deny  []string `toml:"deny"`
}

// parsePolicyTests validates the [[policy.test]] entries.
func parsePolicyTests(in []filePolicyTest, bad func(string, string, ...any)) []PolicyTest {
	var out []PolicyTest
	for i, ft := range in {
		key := fmt.Sprintf("policy.test[%d]", i+1)
		pt := PolicyTest{Token: ft.Token, Proto: policy.ProtoTCP}
		if ft.Proto != "" {
			p, err := policy.ParseProto(ft.Proto)
			if err != nil || p == policy.ProtoAny {
				bad(key+".proto", "%q: want tcp, udp or icmp (a test is one flow)", ft.Proto)
			}
			pt.Proto = p
		}
		if len(ft.Allow) == 0 && len(ft.Deny) == 0 {
			bad(key, "tests nothing: give allow = [\"ADDR:PORT\", ...] and/or deny = [...]")
		}
		parse := func(list []string, k string) []netip.AddrPort {
			var aps []netip.AddrPort
			for _, s := range list {
				ap, err := parseTestDest(s, pt.Proto)
				if err != nil {
					bad(key+"."+k, "%v", err)
					continue
				}
				aps = append(aps, ap)
			}
			return aps
		}
		pt.Allow, pt.Deny = parse(ft.Allow, "allow"), parse(ft.Deny, "deny")
		out = append(out, pt)
	}
	return out
}

// parseTestDest parses a test's destination: ADDR:PORT ([ADDR]:PORT for
// IPv6) for tcp and udp, ADDR for icmp.
func parseTestDest(s string, proto policy.Proto) (netip.AddrPort, error) {
	if proto == policy.ProtoICMP {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("%q: want an address (icmp has no port)", s)
		}
		return netip.AddrPortFrom(a, 0), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("%q: want ADDR:PORT, [IPV6]:PORT, with a port from 1 to 65535 (a name is not resolved)", s)
	}
	return ap, nil
}

// runPolicyTests checks every test against p and reports each failure
// with the rule that decided and why.
func runPolicyTests(p *policy.Policy, tests []PolicyTest, bad func(string, string, ...any)) {
	for i, pt := range tests {
		key := fmt.Sprintf("policy.test[%d]", i+1)
		check := func(aps []netip.AddrPort, want policy.Action, k string) {
			for _, ap := range aps {
				f := policy.Flow{Token: pt.Token, Proto: pt.Proto, Dst: ap.Addr(), Port: ap.Port()}
				e := p.Explain(f)
				if e.Verdict.Action == want {
					continue
				}
				verb := "allows"
				if e.Verdict.Action == policy.Deny {
					verb = "denies"
				}
				bad(key+"."+k, "%s: the policy %s it (%s), the test wants %s", describeFlow(f), verb, e.Steps[len(e.Steps)-1], want)
			}
		}
		check(pt.Allow, policy.Allow, "allow")
		check(pt.Deny, policy.Deny, "deny")
	}
}

// describeFlow names a flow in a message: "tcp to 192.0.2.1:443 for
// token \"cms\"".
func describeFlow(f policy.Flow) string {
	var b strings.Builder
	b.WriteString(f.Proto.String())
	b.WriteString(" to ")
	if f.Proto == policy.ProtoICMP {
		b.WriteString(f.Dst.String())
	} else {
		b.WriteString(netip.AddrPortFrom(f.Dst, f.Port).String())
	}
	if f.Token == "" {
		b.WriteString(" for a token no rule names")
	} else {
		fmt.Fprintf(&b, " for token %q", f.Token)
	}
	return b.String()
}
