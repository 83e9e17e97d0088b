// SPDX-License-Identifier: MIT

package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func TestParseBypass(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(`
version = 1
[[bypass]]
name = "squid"
to = ["10.20.0.5", "10.21.0.0/16"]
proto = "tcp"
ports = [3128, "8000-8080"]
tokens = ["cms"]

[[bypass]]
to = ["192.168.7.0/24"]

[dns]
local_domains = ["Site.Example.", "site.example", "cern.ch"]
resolvers = ["10.20.0.53", "10.20.0.54:5353"]
`))
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Bypass
	if len(b.Rules) != 2 {
		t.Fatalf("rules = %+v", b.Rules)
	}
	r := b.Rules[0]
	if r.Name != "squid" || r.Action != policy.Allow || r.Proto != policy.ProtoTCP || len(r.To) != 2 ||
		r.To[0] != netip.MustParsePrefix("10.20.0.5/32") || len(r.Ports) != 2 || r.Ports[1] != (portblock.Range{Lo: 8000, Hi: 8080}) ||
		len(r.Tokens) != 1 {
		t.Errorf("rule 1 = %+v", r)
	}
	if b.Rules[1].Name != "bypass2" || b.Rules[1].Proto != policy.ProtoAny {
		t.Errorf("rule 2 = %+v, want the default name bypass2, any protocol", b.Rules[1])
	}
	if got := strings.Join(b.LocalDomains, ","); got != "site.example,cern.ch" {
		t.Errorf("local domains = %q, want lower-cased, without the final dot, once each", got)
	}
	if len(b.Resolvers) != 2 || b.Resolvers[0] != netip.MustParseAddrPort("10.20.0.53:53") || b.Resolvers[1].Port() != 5353 {
		t.Errorf("resolvers = %v", b.Resolvers)
	}
	if cfg, err := Parse("t.toml", []byte("version = 1\n")); err != nil || !cfg.Bypass.IsZero() {
		t.Errorf("no bypass: %+v, %v", cfg, err)
	}
}

func TestParseBypassErrors(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"no to", "version = 1\n[[bypass]]\nproto = \"tcp\"\n", "t.toml:2: bypass[1].to: missing"},
		{"loopback", "version = 1\n[[bypass]]\nto = [\"127.0.0.1\"]\n", "t.toml:3: bypass[1].to: 127.0.0.1/32 overlaps 127.0.0.0/8"},
		{"everything", "version = 1\n[[bypass]]\nto = [\"0.0.0.0/0\"]\n", "never bypassed"},
		{"multicast", "version = 1\n[[bypass]]\nto = [\"224.0.0.0/8\"]\n", "never bypassed"},
		{"host bits", "version = 1\n[[bypass]]\nto = [\"10.1.2.3/8\"]\n", "did you mean 10.0.0.0/8"},
		{"action", "version = 1\n[[bypass]]\nto = [\"10.0.0.0/8\"]\naction = \"allow\"\n", "t.toml:4: bypass.action: unknown key"},
		{"icmp ports", "version = 1\n[[bypass]]\nto = [\"10.0.0.0/8\"]\nproto = \"icmp\"\nports = [1]\n", "ICMP has no ports"},
		{"dup", "version = 1\n[[bypass]]\nname = \"a\"\nto = [\"10.0.0.0/8\"]\n[[bypass]]\nname = \"a\"\nto = [\"10.0.0.0/8\"]\n", "t.toml:6: bypass[2].name"},
		{"bad port", "version = 1\n[[bypass]]\nto = [\"10.0.0.0/8\"]\nports = [70000]\n", "t.toml:4: bypass[1].ports"},
		{"bad token", "version = 1\n[[bypass]]\nto = [\"10.0.0.0/8\"]\ntokens = [\"a b\"]\n", "t.toml:4: bypass[1].tokens"},
		{"bad domain", "version = 1\n[dns]\nlocal_domains = [\"-x.example\"]\nresolvers = [\"10.0.0.1\"]\n", "t.toml:3: dns.local_domains"},
		{"no resolvers", "version = 1\n[dns]\nlocal_domains = [\"site.example\"]\n", "t.toml:2: dns: local_domains without resolvers"},
		{"no domains", "version = 1\n[dns]\nresolvers = [\"10.0.0.1\"]\n", "t.toml:3: dns.resolvers: resolvers without local_domains"},
		{"bad resolver", "version = 1\n[dns]\nlocal_domains = [\"a.b\"]\nresolvers = [\"ns1\"]\n", "t.toml:4: dns.resolvers: \"ns1\""},
		{"unknown dns key", "version = 1\n[dns]\nserver = 1\n", "t.toml:3: dns.server: unknown key"},
	}
	for _, tc := range tests {
		_, err := Parse("t.toml", []byte(tc.doc))
		if err == nil {
			t.Errorf("%s: no error, want %q", tc.name, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q, want it to contain %q", tc.name, err, tc.want)
		}
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%s: error %T is not a *config.Error", tc.name, err)
		}
	}
}

// TestExampleBypass checks that the example's bypass entry is one the
// example's policy allows, so that the example bypasses something.
func TestExampleBypass(t *testing.T) {
	cfg, err := Load("../../docs/gateway.example.toml")
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Bypass
	if len(b.Rules) != 1 || b.Rules[0].Name != "cms-xrootd" || len(b.LocalDomains) != 1 || len(b.Resolvers) != 1 {
		t.Fatalf("bypass = %+v", b)
	}
	v := cfg.Policy.Decide(policy.Flow{Token: "cms-pilots", Proto: policy.ProtoTCP, Dst: netip.MustParseAddr("10.20.0.5"), Port: 1094})
	if v.Action != policy.Allow {
		t.Errorf("the example's policy denies its own bypass entry: %v", v)
	}
}
