// SPDX-License-Identifier: MIT

package main

import (
	"net/netip"
	"testing"

	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/gateway"
)

func TestIPv6Flags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
		want func(gateway.Config) bool
	}{
		{nil, true, func(c gateway.Config) bool { return !c.Subnet6.IsValid() && !c.NoIPv6 }},
		{[]string{"--subnet6", "off"}, true, func(c gateway.Config) bool { return c.NoIPv6 }},
		{[]string{"--subnet6", "fd00:1::/48"}, true, func(c gateway.Config) bool { return c.Subnet6 == netip.MustParsePrefix("fd00:1::/48") }},
		{[]string{"--subnet6", "fd00:1::"}, false, nil},
		{[]string{"--egress-addr6", "2001:db8::1"}, true, func(c gateway.Config) bool { return c.EgressAddr6 == netip.MustParseAddr("2001:db8::1") }},
		{[]string{"--egress-addr6", "203.0.113.1"}, false, nil},
		{[]string{"--egress-prefix6", "2001:db8:ee::/96"}, true, func(c gateway.Config) bool {
			return c.EgressPrefix6 == netip.MustParsePrefix("2001:db8:ee::/96")
		}},
		{[]string{"--egress-prefix6", "2001:db8:ee::/112"}, false, nil},
		{[]string{"--egress-prefix6", "2001:db8:ee::1/96"}, false, nil},
		{[]string{"--egress-prefix6", "203.0.113.0/24"}, false, nil},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		f := addIPv6Flags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
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

func TestParseWhoisAddr(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		ok   bool
	}{
		{"203.0.113.1:20311", "203.0.113.1:20311", true},
		{"[2001:db8::1]:20311", "[2001:db8::1]:20311", true},
		{"2001:db8:ee::6440:2", "[2001:db8:ee::6440:2]:0", true},
		{"[::ffff:203.0.113.1]:80", "203.0.113.1:80", true},
		{"fe80::1%eth0", "", false},
		{"host:80", "", false},
	} {
		got, err := parseWhoisAddr(tc.in)
		if (err == nil) != tc.ok || (err == nil && got.String() != tc.want) {
			t.Errorf("parseWhoisAddr(%q) = %v, %v; want %s (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
