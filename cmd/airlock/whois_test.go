// SPDX-License-Identifier: MIT

package main

import "testing"

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
