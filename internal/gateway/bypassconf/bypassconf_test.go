// SPDX-License-Identifier: MIT

package bypassconf

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
)

// TestForJob checks what a job's lease carries: the entries and policy
// rules of its token or of every token, without the token names of
// either, the local domains and resolvers, and nothing when the config
// has no bypass.
func TestForJob(t *testing.T) {
	cfg, err := config.Parse("t.toml", []byte(`version = 1
[policy]
default = "deny"
[[policy.rule]]
name = "no-3128"
action = "deny"
proto = "tcp"
ports = [3128]
[[policy.rule]]
name = "cms-only"
action = "allow"
to = ["10.30.0.0/16"]
tokens = ["cms"]
[[bypass]]
name = "squid"
to = ["10.20.0.5"]
proto = "tcp"
ports = [80, 3128]
[[bypass]]
name = "cms-storage"
to = ["10.30.0.0/16"]
tokens = ["cms"]
[dns]
local_domains = ["site.test"]
resolvers = ["10.20.0.53:53"]
`))
	if err != nil {
		t.Fatal(err)
	}
	names := func(rs []control.Rule) string {
		var s []string
		for _, r := range rs {
			s = append(s, r.Name+":"+r.Action)
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct{ tok, rules, policy string }{
		{"x", "squid:", "no-3128:deny"},
		{"cms", "squid:,cms-storage:", "no-3128:deny,cms-only:allow"},
	} {
		b := ForJob(cfg.Bypass, cfg.Policy, tc.tok)
		if b == nil {
			t.Fatalf("token %s: no bypass", tc.tok)
		}
		if got := names(b.Rules); got != tc.rules {
			t.Errorf("token %s: entries %s, want %s", tc.tok, got, tc.rules)
		}
		if got := names(b.Policy.Rules); got != tc.policy {
			t.Errorf("token %s: policy rules %s, want %s", tc.tok, got, tc.policy)
		}
		if b.Policy.Default != "deny" {
			t.Errorf("token %s: policy default %q, want deny", tc.tok, b.Policy.Default)
		}
		if len(b.LocalDomains) != 1 || b.LocalDomains[0] != "site.test" || len(b.Resolvers) != 1 || b.Resolvers[0] != netip.MustParseAddrPort("10.20.0.53:53") {
			t.Errorf("token %s: local domains %v, resolvers %v", tc.tok, b.LocalDomains, b.Resolvers)
		}
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(raw), `"cms"`) || strings.Contains(string(raw), "tokens") {
			t.Errorf("token %s: the wire form names tokens: %s", tc.tok, raw)
		}
	}
	if b := ForJob(config.Bypass{}, cfg.Policy, "x"); b != nil {
		t.Errorf("ForJob without bypass entries = %+v, want nil", b)
	}
}
