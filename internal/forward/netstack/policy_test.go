// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestPolicy checks that the user-mode forwarder enforces the policy before
// it dials: a denied TCP connection is reset at once without a dial, a
// token-scoped allow lets only that token's job reach a private range,
// denied UDP is dropped, and every denial is counted by rule.
func TestPolicy(t *testing.T) {
	checkGoroutines(t)
	p := newPair(t, Config{HostAddrs: func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
	}})
	ln := listenTCP(t, func(c net.Conn) { c.Write([]byte("hi")); c.Close() })
	for _, d := range []string{"198.51.100.7:80", "198.51.100.7:25", "10.1.2.3:80", "192.0.2.1:22", "169.254.169.254:80"} {
		p.dial.route(d, ln)
	}
	pol := &policy.Policy{Rules: []policy.Rule{
		{Name: "no-smtp", Action: policy.Deny, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}}},
		{Name: "lab", Action: policy.Allow, To: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, Tokens: []string{"lab"}},
	}}
	if err := p.s.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	dial := func(dst string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		c, err := p.jobDialTCP(ctx, dst)
		if err == nil {
			c.Close()
			return nil
		}
		if !isRefused(err) || time.Since(start) > 2*time.Second {
			t.Errorf("dial %s: %v after %v, want a prompt refusal", dst, err, time.Since(start))
		}
		return err
	}
	for _, tc := range []struct {
		token, dst string
		ok         bool
	}{
		{"", "198.51.100.7:80", true},
		{"", "198.51.100.7:25", false},    // no-smtp
		{"", "10.1.2.3:80", false},        // builtin-private
		{"lab", "10.1.2.3:80", true},      // lab
		{"lab", "198.51.100.7:25", false}, // no-smtp comes first
		{"lab", "192.0.2.1:22", false},    // builtin-host
		{"lab", "169.254.169.254:80", false},
	} {
		j := testJob("L", jobAddr)
		j.Ref.Token = tc.token
		if err := p.s.AddJob(j); err != nil {
			t.Fatal(err)
		}
		if err := dial(tc.dst); (err == nil) != tc.ok {
			t.Errorf("token %q to %s: got %v, want allowed %v", tc.token, tc.dst, err, tc.ok)
		}
		p.s.RemoveJob("L")
	}
	for _, c := range p.dial.Calls() {
		if c != "tcp4 198.51.100.7:80" && c != "tcp4 10.1.2.3:80" {
			t.Errorf("dialled a denied destination: %s", c)
		}
	}
	// Denied UDP is dropped and counted.
	u := p.jobDialUDP(t, "10.9.9.9:53")
	u.Write([]byte("q"))
	want := map[string]uint64{"no-smtp": 2, policy.RulePrivate: 2, policy.RuleHost: 1, policy.RuleMetadata: 1}
	if !topology.Poll(2*time.Second, func() bool {
		got := p.s.policyDrops()
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("PolicyDrops = %v, want %v", p.s.policyDrops(), want)
	}
	// A new policy applies to new flows; the counts stay.
	if err := p.s.SetPolicy(&policy.Policy{Default: policy.Deny}); err != nil {
		t.Fatal(err)
	}
	if err := dial("198.51.100.7:80"); err == nil {
		t.Error("default deny: dial allowed")
	}
	got := p.s.policyDrops()
	if got[policy.RuleDefault] != 1 || got["no-smtp"] != 2 {
		t.Errorf("after reload: PolicyDrops = %v", got)
	}
	// A bad policy is refused and the old one stays.
	if err := p.s.SetPolicy(&policy.Policy{Rules: []policy.Rule{{Name: "builtin-x"}}}); err == nil {
		t.Error("SetPolicy accepted a reserved rule name")
	}
	p.s.RemoveJob("L")
	if j := p.s.jobOf(jobAddr); j != nil {
		t.Errorf("job after RemoveJob: %+v", j)
	}
}
