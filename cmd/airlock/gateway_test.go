// SPDX-License-Identifier: MIT

package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func TestParseEgress(t *testing.T) {
	for _, tt := range []struct {
		mode, ports string
		block       int
		wantErr     string
		wantPorts   portblock.Range
	}{
		{mode: "user", block: 256},
		{mode: "kernel", ports: "20000-29999", block: 128, wantPorts: portblock.Range{Lo: 20000, Hi: 29999}},
		{mode: "fast", block: 256, wantErr: `bad --egress "fast"`},
		{mode: "kernel", ports: "30000", block: 256, wantErr: "bad --egress-ports"},
		{mode: "kernel", ports: "3-2", block: 256, wantErr: "bad --egress-ports"},
		{mode: "user", block: 0, wantErr: "bad --block-size"},
	} {
		cfg := gateway.Config{Egress: tt.mode, BlockSize: tt.block}
		err := parseEgress(&cfg, tt.ports)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%+v: got %v, want error with %q", tt, err, tt.wantErr)
			}
			continue
		}
		if err != nil || cfg.EgressPorts != tt.wantPorts {
			t.Errorf("%+v: got %v, %v; want %v", tt, err, cfg.EgressPorts, tt.wantPorts)
		}
	}
}

// addrFlagCases are TestAddrFlags' cases: the flags, whether they parse,
// and what the config must then hold.
var addrFlagCases = []struct {
	args []string
	ok   bool
	want func(gateway.Config) bool
}{
	{nil, true, func(c gateway.Config) bool {
		return slices.Equal(c.Subnets, mustPrefixes(gateway.DefaultSubnet)) && !c.NoIPv6 && c.EgressAddrs == nil
	}},
	{[]string{"--subnet", "10.8.0.0/16"}, true, func(c gateway.Config) bool { return slices.Equal(c.Subnets, mustPrefixes("10.8.0.0/16")) }},
	{[]string{"--subnet", "10.8.0.0"}, false, nil},
	{[]string{"--egress-addr", "203.0.113.1"}, true, func(c gateway.Config) bool { return slices.Equal(c.EgressAddrs, mustAddrs("203.0.113.1")) }},
	{[]string{"--egress-addr", "203.0.113.1,203.0.113.2"}, true, func(c gateway.Config) bool { return len(c.EgressAddrs) == 2 }},
	{[]string{"--egress-addr", "gateway.example"}, false, nil},
	{[]string{"--subnet6", "off"}, true, func(c gateway.Config) bool { return c.NoIPv6 }},
	{[]string{"--subnet6", "fd00:1::/48"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.Subnets, mustPrefixes(gateway.DefaultSubnet, "fd00:1::/48"))
	}},
	{[]string{"--subnet6", "fd00:1::"}, false, nil},
	{[]string{"--subnet6", "10.0.0.0/8"}, false, nil},
	{[]string{"--egress-addr6", "2001:db8::1"}, true, func(c gateway.Config) bool { return slices.Equal(c.EgressAddrs, mustAddrs("2001:db8::1")) }},
	{[]string{"--egress-addr6", "203.0.113.1"}, false, nil},
	{[]string{"--egress-addr6", "::ffff:203.0.113.1"}, false, nil},
	{[]string{"--egress-prefix6", "2001:db8:ee::/96"}, true, func(c gateway.Config) bool {
		return c.EgressPrefix6 == netip.MustParsePrefix("2001:db8:ee::/96")
	}},
	{[]string{"--egress-prefix6", "2001:db8:ee::/112"}, false, nil},
	{[]string{"--egress-prefix6", "2001:db8:ee::1/96"}, false, nil},
	{[]string{"--egress-prefix6", "203.0.113.0/24"}, false, nil},
	// The lists: either family in one flag.
	{[]string{"--subnet", "10.8.0.0/16,fd00:1::/48"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.Subnets, mustPrefixes("10.8.0.0/16", "fd00:1::/48")) && !c.NoIPv6
	}},
	{[]string{"--subnet", "10.8.0.0/16, no-ipv6"}, true, func(c gateway.Config) bool { return c.NoIPv6 && slices.Equal(c.Subnets, mustPrefixes("10.8.0.0/16")) }},
	{[]string{"--subnet", "fd00:1::/48"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.Subnets, mustPrefixes("fd00:1::/48"))
	}},
	{[]string{"--subnet", "fd00:1::/48,fd00:2::/48"}, false, nil},
	{[]string{"--subnet", "10.8.0.0/16,fd00:1::/48,no-ipv6"}, false, nil},
	{[]string{"--subnet", "::ffff:10.8.0.0/112"}, false, nil},
	{[]string{"--subnet", "10.8.0.0/16", "--subnet6", "fd00:1::/48"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.Subnets, mustPrefixes("10.8.0.0/16", "fd00:1::/48"))
	}},
	{[]string{"--egress-addr", "203.0.113.1,2001:db8::1"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.EgressAddrs, mustAddrs("203.0.113.1", "2001:db8::1"))
	}},
	{[]string{"--egress-addr", "2001:db8::1"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.EgressAddrs, mustAddrs("2001:db8::1"))
	}},
	{[]string{"--subnet", "fd00:1::/120", "--egress-addr", "2001:db8::1"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.EgressAddrs, mustAddrs("2001:db8::1")) && slices.Equal(c.Subnets, mustPrefixes("fd00:1::/120"))
	}},
	{[]string{"--egress-addr", "2001:db8::1,2001:db8::2"}, false, nil},
	{[]string{"--egress-addr", "2001:db8::1, 203.0.113.1,203.0.113.2"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.EgressAddrs, mustAddrs("203.0.113.1", "203.0.113.2", "2001:db8::1"))
	}},
	{[]string{"--egress-addr", "203.0.113.1", "--egress-addr6", "2001:db8::1"}, true, func(c gateway.Config) bool {
		return slices.Equal(c.EgressAddrs, mustAddrs("203.0.113.1", "2001:db8::1"))
	}},
	{[]string{"--egress-addr", "2001:db8::1", "--egress-addr6", "2001:db8::2"}, false, nil},
	{[]string{"--subnet", "10.8.0.0/16,no-ipv6", "--egress-addr", "2001:db8::1"}, false, nil},
	{[]string{"--egress-prefix", "2001:db8:ee::/96"}, true, func(c gateway.Config) bool {
		return c.EgressPrefix6 == netip.MustParsePrefix("2001:db8:ee::/96")
	}},
	{[]string{"--egress-prefix", "203.0.113.0/24"}, false, nil},
	{[]string{"--egress-prefix", "2001:db8:ee::/96", "--egress-prefix6", "2001:db8:ef::/96"}, false, nil},
}

// mustPrefixes parses ss.
func mustPrefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// mustAddrs parses ss.
func mustAddrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestAddrFlags: the address flags of both families.
func TestAddrFlags(t *testing.T) {
	for _, tc := range addrFlagCases {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		var out strings.Builder
		fs.SetOutput(&out)
		f := addAddrFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		// A deprecated alias says so, naming what replaces it.
		for _, a := range tc.args {
			if strings.HasPrefix(a, "--") && strings.HasSuffix(a, "6") && !strings.Contains(out.String(), a[2:]+" has been deprecated") {
				t.Errorf("%v: no deprecation note for %s: %q", tc.args, a, out.String())
			}
		}
		var cfg gateway.Config
		err := f.parse(&cfg)
		if (err == nil) != tc.ok {
			t.Errorf("%v: err %v, want ok %v", tc.args, err, tc.ok)
			continue
		}
		if err == nil && !tc.want(cfg) {
			t.Errorf("%v: got %+v", tc.args, cfg)
		}
	}
}

func TestLimitFlags(t *testing.T) {
	var c gateway.LimitsConfig
	f := limitFlags{jobEgress: "100mbit", jobIngress: "50Mbit", egress: "1gbit", tokens: "cms, atlas,"}
	if err := f.parse(&c); err != nil {
		t.Fatal(err)
	}
	if c.Job.EgressBitsPerSec != 100e6 || c.Job.IngressBitsPerSec != 50e6 || c.GlobalEgressBitsPerSec != 1e9 || c.GlobalIngressBitsPerSec != 0 {
		t.Errorf("rates: got %+v", c)
	}
	if strings.Join(c.Tokens, " ") != "cms atlas" {
		t.Errorf("tokens: got %q, want [cms atlas]", c.Tokens)
	}
	for _, tt := range []struct {
		f    limitFlags
		c    gateway.LimitsConfig
		want string
	}{
		{f: limitFlags{jobIngress: "fast"}, want: "--job-ingress-rate"},
		{f: limitFlags{ingress: "10 parsecs"}, want: "--ingress-rate"},
		{c: gateway.LimitsConfig{Job: limits.Job{MaxFlows: -2}}, want: "--job-max-flows"},
	} {
		if err := tt.f.parse(&tt.c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: got %v, want an error naming %s", tt.f, err, tt.want)
		}
	}
}

func TestDiagRedact(t *testing.T) {
	for in, want := range map[string]string{
		`store "postgres://airlock_gateway:s3cr%40t@db.example.org/airlock": refused`: `store "postgres://airlock_gateway:REDACTED@db.example.org/airlock": refused`,
		"host=db password=hunter2 sslmode=verify-full":                                "host=db password=REDACTED sslmode=verify-full",
		"PGPASSWORD=hunter2":                                    "PGPASSWORD=REDACTED",
		"token alk1_AbC-d_e9 given":                             "token alk1_REDACTED given",
		"postgres://db.example.org/airlock?sslmode=verify-full": "postgres://db.example.org/airlock?sslmode=verify-full",
	} {
		if got := string(redact([]byte(in))); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
