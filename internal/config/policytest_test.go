// SPDX-License-Identifier: MIT

package config

import (
	"strings"
	"testing"
)

func TestPolicyTests(t *testing.T) {
	const rules = `version = 1
[policy]
default = "allow"
[[policy.rule]]
name = "no-smtp"
action = "deny"
proto = "tcp"
ports = [25]
[[policy.rule]]
name = "storage"
action = "allow"
to = ["10.20.0.0/16"]
tokens = ["cms"]
`
	tests := []struct {
		name    string
		tests   string
		wantErr []string
	}{
		{name: "pass", tests: `
[[policy.test]]
token = "cms"
allow = ["10.20.1.5:1094", "198.51.100.7:443"]
deny = ["198.51.100.7:25", "10.30.0.1:443"]
[[policy.test]]
proto = "icmp"
allow = ["198.51.100.7"]
deny = ["10.20.1.5"]
`},
		{name: "fail", tests: `
[[policy.test]]
token = "atlas"
allow = ["10.20.1.5:1094"]
deny = ["198.51.100.7:443"]
`, wantErr: []string{
			`:17: policy.test[1].allow: tcp to 10.20.1.5:1094 for token "atlas": the policy denies it (no rule allows it by name, so the built-in builtin-private denies 10.20.1.5`,
			`policy.test[1].deny: tcp to 198.51.100.7:443 for token "atlas": the policy allows it (no rule matches, so the policy's default (allow) decides), the test wants deny`}},
		{name: "bad destination", tests: `
[[policy.test]]
allow = ["gw.example.org:443", "198.51.100.7"]
`, wantErr: []string{`policy.test[1].allow: "gw.example.org:443": want ADDR:PORT`, `"198.51.100.7": want ADDR:PORT`}},
		{name: "empty", tests: "[[policy.test]]\ntoken = \"cms\"\n", wantErr: []string{"policy.test[1]: tests nothing"}},
		{name: "any", tests: "[[policy.test]]\nproto = \"any\"\nallow = [\"198.51.100.7:1\"]\n", wantErr: []string{`policy.test[1].proto: "any": want tcp, udp or icmp`}},
		{name: "unknown key", tests: "[[policy.test]]\naccept = [\"198.51.100.7:1\"]\n", wantErr: []string{"policy.test.accept: unknown key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("gw.toml", []byte(rules+tt.tests))
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if len(cfg.PolicyTests) != 2 {
					t.Errorf("got %d tests, want 2", len(cfg.PolicyTests))
				}
				return
			}
			if err == nil {
				t.Fatalf("got no error, want %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
