// SPDX-License-Identifier: MIT

package config

import (
	"strings"
	"testing"
)

func TestWarnings(t *testing.T) {
	const doc = `version = 1
[policy]
default = "allow"
[[policy.rule]]
name = "no-smtp"
action = "deny"
proto = "tcp"
ports = [25, 465, 587]
[[policy.rule]]
name = "no-smtp-25"
action = "deny"
proto = "tcp"
ports = [25]
to = ["192.0.2.0/24"]
[[policy.rule]]
name = "web"
action = "allow"
to = ["0.0.0.0/0"]
[[policy.rule]]
name = "site"
action = "allow"
to = ["10.20.0.0/24"]
tokens = ["cms"]
[[policy.rule]]
name = "public-dns"
action = "allow"
to = ["198.51.100.53/32"]
[[bypass]]
name = "squid"
to = ["10.20.0.5"]
proto = "tcp"
ports = [3128]
[[bypass]]
name = "storage"
to = ["10.30.0.0/16"]
proto = "tcp"
ports = [1094]
[[expose]]
tokens = ["atlas"]
ports = ["8000-8999"]
[limits.token.ghost]
egress_rate = "1gbit"
`
	c, err := Parse("gw.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range c.Warnings([]string{"cms", "atlas"}) {
		got = append(got, w.String())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		// Shadowed: a narrower deny after a broader one, and an allow of a
		// public address after an allow of everything public.
		`gw.toml:9: policy.rule[2]: rule "no-smtp-25" never matches: rule "no-smtp" (policy.rule[1]) matches every flow it would, first; move it above "no-smtp", or remove it`,
		`policy.rule[5]: rule "public-dns" never matches: rule "web" (policy.rule[3])`,
		// A bypass of a private range no allow rule names.
		`bypass[2]: bypass entry "storage" does nothing: the policy denies 10.30.0.0 tcp/1094 for every token (rule builtin-private)`,
		`add a [[policy.rule]] with action = "allow" and to = ["10.30.0.0/16"]`,
		// A token no token has.
		`limits.token.ghost: token "ghost" does not exist`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("warnings lack %q:\n%s", want, all)
		}
	}
	for _, notWant := range []string{
		`rule "site" never matches`, // names a private range "web" does not open
		`bypass entry "squid"`,      // "site" allows it for cms
		`token "cms"`, `token "atlas"`,
	} {
		if strings.Contains(all, notWant) {
			t.Errorf("warnings have %q:\n%s", notWant, all)
		}
	}
	if len(got) != 4 {
		t.Errorf("%d warnings, want 4:\n%s", len(got), all)
	}
	// Tokens unknown: no token warnings.
	if ws := c.Warnings(nil); len(ws) != 3 {
		t.Errorf("Warnings(nil): %d, want 3 (no token check)", len(ws))
	}
	// The example config has nothing that cannot take effect.
	ex, err := Load("../../docs/gateway.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if ws := ex.Warnings(nil); len(ws) != 0 {
		t.Errorf("docs/gateway.example.toml: %v", ws)
	}
}
