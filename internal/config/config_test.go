// SPDX-License-Identifier: MIT

package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func TestExampleFile(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "gateway.example.toml")
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("docs/gateway.example.toml does not load: %v", err)
	}
	if len(cfg.Policy.Rules) != 3 || cfg.Policy.Rules[1].Name != "cms-storage" {
		t.Errorf("rules = %+v", cfg.Policy.Rules)
	}
	if got := cfg.Limits.ForToken("cms-pilots"); got != (limits.Job{EgressBitsPerSec: 5e9, MaxFlows: 1024, NewFlowsPerSec: 100}) {
		t.Errorf("cms-pilots limits = %+v", got)
	}
	if got := cfg.Limits.ForToken("other"); got != (limits.Job{EgressBitsPerSec: 1e9, IngressBitsPerSec: 2e9, MaxFlows: 1024, NewFlowsPerSec: 100}) {
		t.Errorf("default limits = %+v", got)
	}
	if cfg.Limits.EgressBitsPerSec != 10e9 {
		t.Errorf("global egress = %d", cfg.Limits.EgressBitsPerSec)
	}
	if !cfg.Exposure.Allowed("cms-pilots", policy.ProtoTCP, 8080) || cfg.Exposure.Allowed("other", policy.ProtoTCP, 8080) {
		t.Error("exposure rules not as in the example")
	}
	if got := cfg.Quotas.ForToken("cms-pilots"); got != (Quota{MaxLeases: 5000, JoinsPerMinute: 6000}) {
		t.Errorf("cms-pilots quota = %+v", got)
	}
}

func TestParse(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(`
version = 1
[policy]
default = "deny"
[[policy.rule]]
action = "allow"
to = ["203.0.113.7", "2001:db8::/32"]
proto = "udp"
ports = [53, "5000-5010"]
[[policy.rule]]
name = "icmp"
action = "allow"
proto = "icmp"
[limits.job]
new_flows_per_sec = 0.5
max_flows = 10
[limits.token."a.b"]
max_flows = 0
`))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Policy
	if p.Default != policy.Deny || len(p.Rules) != 2 {
		t.Fatalf("policy = %+v", p)
	}
	r := p.Rules[0]
	if r.Name != "rule1" || r.Proto != policy.ProtoUDP || len(r.To) != 2 || r.To[0].String() != "203.0.113.7/32" ||
		len(r.Ports) != 2 || r.Ports[1] != (portblock.Range{Lo: 5000, Hi: 5010}) {
		t.Errorf("rule 1 = %+v", r)
	}
	if got := cfg.Limits.ForToken("a.b"); got != (limits.Job{NewFlowsPerSec: 0.5}) {
		t.Errorf("a.b limits = %+v, want the job default with max_flows lifted", got)
	}
	if len(cfg.Exposure.Rules) != 0 || cfg.Exposure.Allowed("x", policy.ProtoTCP, 80) {
		t.Error("a config without [[expose]] must allow no exposure")
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string // substring of the error, with line and key
	}{
		{"no version", "[policy]\n", "t.toml: version: missing"},
		{"wrong version", "version = 2\n", "t.toml:1: version: 2"},
		{"unknown top key", "version = 1\npolcy = 1\n", "t.toml:2: polcy: unknown key"},
		{"unknown rule key", "version = 1\n[[policy.rule]]\naction = \"deny\"\nport = [1]\n", "t.toml:4: policy.rule.port: unknown key"},
		{"syntax", "version = 1\n[policy\n", "t.toml:2"},
		{"type", "version = 1\n[limits.job]\nmax_flows = \"ten\"\n", "t.toml:3: limits.job.max_flows: wrong type: got a TOML string, want a number"},
		{"bad default", "version = 1\n[policy]\ndefault = \"maybe\"\n", "t.toml:3: policy.default: \"maybe\""},
		{"no action", "version = 1\n[[policy.rule]]\nto = [\"1.2.3.4\"]\n", "t.toml:2: policy.rule[1]: no action"},
		{"bad action", "version = 1\n[[policy.rule]]\naction = \"allow\"\n[[policy.rule]]\naction = \"permit\"\n", "t.toml:5: policy.rule[2].action"},
		{"bad cidr", "version = 1\n[[policy.rule]]\naction = \"deny\"\n\nto = [\"10.0.0.0/33\"]\n", "t.toml:5: policy.rule[1].to"},
		{"host bits", "version = 1\n[[policy.rule]]\naction = \"deny\"\nto = [\"10.1.2.3/8\"]\n", "did you mean 10.0.0.0/8"},
		{"bad proto", "version = 1\n[[policy.rule]]\naction = \"deny\"\nproto = \"sctp\"\n", "t.toml:4: policy.rule[1].proto"},
		{"port 0", "version = 1\n[[policy.rule]]\naction = \"deny\"\nports = [0]\n", "t.toml:4: policy.rule[1].ports: port 0"},
		{"port range", "version = 1\n[[policy.rule]]\naction = \"deny\"\nports = [\"9-1\"]\n", "policy.rule[1].ports"},
		{"icmp ports", "version = 1\n[[policy.rule]]\naction = \"deny\"\nproto = \"icmp\"\nports = [1]\n", "ICMP has no ports"},
		{"dup name", "version = 1\n[[policy.rule]]\nname = \"a\"\naction = \"deny\"\n[[policy.rule]]\nname = \"a\"\naction = \"deny\"\n", "t.toml:6: policy.rule[2].name"},
		{"reserved name", "version = 1\n[[policy.rule]]\nname = \"builtin-host\"\naction = \"allow\"\n", "reserved"},
		{"bad token", "version = 1\n[[policy.rule]]\naction = \"deny\"\ntokens = [\"a b\"]\n", "t.toml:4: policy.rule[1].tokens"},
		{"bad rate", "version = 1\n[limits]\negress_rate = \"fast\"\n", "t.toml:3: limits.egress_rate"},
		{"bad token rate", "version = 1\n[limits.token.x]\ningress_rate = \"1 furlong\"\n", "t.toml:3: limits.token.x.ingress_rate"},
		{"negative flows", "version = 1\n[limits.job]\nmax_flows = -1\n", "t.toml:3: limits.job.max_flows"},
		{"expose icmp", "version = 1\n[[expose]]\nproto = \"icmp\"\n", "t.toml:3: expose[1].proto"},
		{"empty to", "version = 1\n[[policy.rule]]\naction = \"deny\"\nto = []\n", "t.toml:4: policy.rule[1].to: empty list"},
		{"inline rule", "version = 1\n[policy]\nrule = [\n  {action = \"deny\"},\n  {action = \"nope\"},\n]\n", "t.toml:5: policy.rule[2].action"},
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

func TestLoadAbsent(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.toml"))
	if !errors.Is(err, ErrAbsent) {
		t.Errorf("missing file: %v, want ErrAbsent", err)
	}
	p := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(p, []byte("version = 1\nx = 1\n"), 0o600)
	_, err = Load(p)
	if err == nil || errors.Is(err, ErrAbsent) || !strings.Contains(err.Error(), p+":2: x:") {
		t.Errorf("invalid file: %v, want an error naming %s:2: x", err, p)
	}
}

// FuzzParse checks that Parse never panics and that whatever it accepts
// is a valid policy.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "..", "docs", "gateway.example.toml")); err == nil {
		f.Add(b)
	}
	f.Add([]byte("version = 1\n[[policy.rule]]\naction = \"deny\"\nports = [1, \"2-3\"]\n"))
	f.Add([]byte("version = 1\n[policy]\nrule = [{action=\"allow\", to=[\"::/0\"]}]\n[limits.token.'x']\nmax_flows=1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.toml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.toml") {
				t.Errorf("error does not name the file: %v", err)
			}
			return
		}
		if err := cfg.Policy.Validate(); err != nil {
			t.Errorf("accepted an invalid policy: %v", err)
		}
		if err := cfg.Exposure.Validate(); err != nil {
			t.Errorf("accepted invalid exposure rules: %v", err)
		}
		if err := cfg.Limits.Job.Validate(); err != nil {
			t.Errorf("accepted invalid limits: %v", err)
		}
	})
}
