// SPDX-License-Identifier: MIT

package kernel

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func testPolicy() *policy.Policy {
	return &policy.Policy{Default: policy.Deny, Rules: []policy.Rule{
		{Name: "no-smtp", Action: policy.Deny, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}, {Lo: 465, Hi: 587}}},
		{Name: "lab", Action: policy.Allow, To: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, Tokens: []string{"lab"}},
		{Name: "web", Action: policy.Allow, Proto: policy.ProtoAny, Ports: []portblock.Range{{Lo: 443, Hi: 443}}},
		{Name: "host-web", Action: policy.Allow, To: []netip.Prefix{netip.MustParsePrefix("203.0.113.1/32")}, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 8080, Hi: 8080}}},
		{Name: "v6", Action: policy.Allow, To: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}},
	}}
}

// TestCompilePolicy checks the shape of the compiled rules without
// privileges.
func TestCompilePolicy(t *testing.T) {
	c := testRules.compilePolicy(table(), testPolicy(), 1)
	tags := map[string]int{}
	for _, r := range c.main {
		tags[r.tag]++
	}
	// no-smtp: 2 port matches; lab: 1 (scoped); web: tcp+udp; host-web: 1;
	// v6: none; then the 12 protected IPv4 ranges of the built-in list,
	// default.
	if len(c.main) != 2+1+2+1+12+1 {
		t.Errorf("policy chain: %d rules, want 19", len(c.main))
	}
	if tags["no-smtp"] != 2 || tags[policy.RuleLinkLocal] != 1 || tags[policy.RulePrivate] != 3 ||
		tags[policy.RuleInternal] != 4 || tags[policy.RuleMetadata] != 4 || tags[policy.RuleDefault] != 1 {
		t.Errorf("counted tags %v", tags)
	}
	if s, ok := c.scopes[1]; !ok || s.sets[0].Name != "scope1_1" || s.tokens[0] != "lab" || len(c.scopes) != 1 {
		t.Errorf("scopes %+v, want one set scope1_1 for rule 2", c.scopes)
	}
	// host_policy: the tunnel address return, the deny rules, the /32
	// allow, builtin-host.
	if len(c.host) != 1+2+1+1 || c.host[len(c.host)-1].tag != policy.RuleHost {
		t.Errorf("host_policy: %d rules, want 5 ending with %s", len(c.host), policy.RuleHost)
	}
}

// TestPolicyRules programs a policy in a fresh network namespace and checks
// the table, the token sets and an atomic replacement.
func TestPolicyRules(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	f := newTestForwarder(t)
	defer f.Close()
	job, other := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("100.64.0.3")
	add := func(a netip.Addr, token string) {
		j := v4Job(a, portblock.Range{Lo: 20000, Hi: 20255})
		j.Ref.Token = token
		if err := f.AddJob(j); err != nil {
			t.Fatal(err)
		}
	}
	add(job, "lab")
	if err := f.SetPolicy(testPolicy()); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	add(other, "other")
	out := nftList(t)
	if out == "" {
		t.Skip("nft not installed")
	}
	for _, want := range []string{
		"tcp dport 25 counter packets 0 bytes 0 goto policy_deny",
		"tcp dport 465-587 counter packets 0 bytes 0 goto policy_deny",
		"ip saddr @scope1_1 ip daddr 10.1.0.0/16 return",
		"udp dport 443 ip daddr != 10.0.0.0/8 ip daddr != 100.64.0.0/10 ip daddr != 168.63.129.16 ip daddr != 169.254.0.0/16 ip daddr != 172.16.0.0/12 ip daddr != 192.0.0.0/24 ip daddr != 192.168.0.0/16 ip daddr != 198.18.0.0/15 ip daddr != 240.0.0.0/4 return",
		"ip daddr 100.100.100.200 counter packets 0 bytes 0 goto policy_deny",
		"ip daddr 192.0.0.0/24 counter packets 0 bytes 0 goto policy_deny",
		"tcp dport 8080 ip daddr 203.0.113.1 accept",
		"elements = { 100.64.0.2 }",
	} {
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("nft list table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "100.64.0.3 }") || strings.Contains(out, ", 100.64.0.3") {
		t.Errorf("job of another token is in a scope set:\n%s", out)
	}
	// Replace: the new policy's set holds the job, the old set is gone.
	p := testPolicy()
	p.Rules[1].Tokens = []string{"lab", "other"}
	if err := f.SetPolicy(p); err != nil {
		t.Fatalf("second SetPolicy: %v", err)
	}
	out = nftList(t)
	if strings.Contains(out, "scope1_1") || !strings.Contains(out, "scope2_1") || !strings.Contains(out, "elements = { 100.64.0.2, 100.64.0.3 }") {
		t.Errorf("after replacing the policy:\n%s", out)
	}
	f.RemoveJob(idOf(other))
	if out = nftList(t); !strings.Contains(out, "elements = { 100.64.0.2 }") {
		t.Errorf("removed job still in a scope set:\n%s", out)
	}
	drops, err := f.policyDrops()
	if err != nil || len(drops) != 0 && drops["no-smtp"] != 0 {
		t.Errorf("PolicyDrops = %v, %v; want no drops yet", drops, err)
	}
	if err := f.SetPolicy(&policy.Policy{Rules: []policy.Rule{{Name: "builtin-x"}}}); err == nil {
		t.Error("SetPolicy accepted a reserved name")
	}
}

// TestFloorFromPolicyList checks that kernel mode compiles every IPv4
// entry of the one built-in list (policy.Ranges): floor entries and the
// tunnel subnet into from_jobs, protected ones into deny rules tagged with
// their rule, and an allow rule for 0.0.0.0/0 excludes each of them.
func TestFloorFromPolicyList(t *testing.T) {
	floor := map[netip.Prefix]bool{}
	for _, p := range testRules.floorV4() {
		floor[p] = true
	}
	if !floor[testRules.v4().Masked()] {
		t.Errorf("floor %v lacks the tunnel subnet %v", testRules.floorV4(), testRules.v4().Masked())
	}
	c := testRules.compilePolicy(table(), &policy.Policy{}, 1)
	denied := map[netip.Prefix]string{}
	for _, r := range c.main {
		for i, x := range r.exprs {
			// A destination prefix: its bytes (whole bytes only) or
			// the address, loaded from offset 16.
			if cmp, ok := x.(*expr.Cmp); ok && i > 0 && cmp.Op == expr.CmpOpEq && dstLoad(r.exprs[:i]) {
				var b [4]byte
				copy(b[:], cmp.Data)
				a := netip.AddrFrom4(b)
				for _, pr := range policy.Ranges() {
					if pr.Prefix.Addr() == a {
						denied[pr.Prefix] = r.tag
					}
				}
			}
		}
	}
	excluded := map[netip.Prefix]bool{}
	for _, p := range unnamedV4(netip.MustParsePrefix("0.0.0.0/0")) {
		excluded[p] = true
	}
	for _, pr := range policy.Ranges() {
		if !pr.Prefix.Addr().Is4() {
			continue
		}
		switch pr.Rule {
		case policy.RuleFloor:
			if !floor[pr.Prefix] {
				t.Errorf("%v (%s): not in from_jobs' floor", pr.Prefix, pr.Name)
			}
		case "":
		default:
			if denied[pr.Prefix] != pr.Rule {
				t.Errorf("%v (%s): denied under %q, want %q", pr.Prefix, pr.Name, denied[pr.Prefix], pr.Rule)
			}
			covered := false
			for p := range excluded {
				covered = covered || p.Bits() <= pr.Prefix.Bits() && p.Contains(pr.Prefix.Addr())
			}
			if !covered {
				t.Errorf("%v (%s): an allow of 0.0.0.0/0 does not exclude it", pr.Prefix, pr.Name)
			}
		}
	}
}

// dstLoad reports whether the last load of exprs is of the IPv4
// destination address, from its first byte.
func dstLoad(exprs []expr.Any) bool {
	for i := len(exprs) - 1; i >= 0; i-- {
		if pl, ok := exprs[i].(*expr.Payload); ok {
			return pl.Base == expr.PayloadBaseNetworkHeader && pl.Offset == 16
		}
	}
	return false
}

// TestSpan: a prefix of whole bytes loads only those, another prefix the
// whole address, any other mask the bytes from its first set bit's to its
// last's.
func TestSpan(t *testing.T) {
	mask := func(p string) []byte {
		m := prefixRange(netip.MustParsePrefix(p), "").mask
		return m[:]
	}
	for _, tc := range []struct {
		mask   []byte
		lo, hi int
	}{
		{mask("2002:a00::/24"), 0, 3},
		{mask("64:ff9b::a00:0/104"), 0, 13},
		{mask("64:ff9b::ac10:0/108"), 0, 16},
		{mask("::/0"), 0, 16},
		{[]byte{0xff, 0xff, 0, 0}, 0, 2},
		{[]byte{0xff, 0xfe, 0, 0}, 0, 4},
		{[]byte{0, 0xff, 0, 0xf0}, 1, 4},
		{append(mask("2001::/32")[:12:12], 0xff, 0, 0, 0), 0, 13},
	} {
		if lo, hi := span(tc.mask); lo != tc.lo || hi != tc.hi {
			t.Errorf("span(%x) = %d, %d; want %d, %d", tc.mask, lo, hi, tc.lo, tc.hi)
		}
	}
}
