// SPDX-License-Identifier: MIT

package control

import "testing"

func TestParsePort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Port
		ok   bool
	}{
		{"8080", Port{ProtoTCP, 8080}, true},
		{"8080/tcp", Port{ProtoTCP, 8080}, true},
		{"53/udp", Port{ProtoUDP, 53}, true},
		{"53/UDP", Port{ProtoUDP, 53}, true},
		{" 1 ", Port{ProtoTCP, 1}, true},
		{"65535/udp", Port{ProtoUDP, 65535}, true},
		{"0", Port{}, false},
		{"65536", Port{}, false},
		{"-1", Port{}, false},
		{"", Port{}, false},
		{"http", Port{}, false},
		{"8080/sctp", Port{}, false},
		{"8080/", Port{}, false},
		{"/tcp", Port{}, false},
		{"80-90", Port{}, false},
		{"8080/tcp/udp", Port{}, false},
	} {
		got, err := ParsePort(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParsePort(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err == nil {
			if err := got.Validate(); err != nil {
				t.Errorf("ParsePort(%q).Validate() = %v", tc.in, err)
			}
		}
	}
	if s := (Port{ProtoUDP, 53}).String(); s != "53/udp" {
		t.Errorf("String() = %q, want 53/udp", s)
	}
}
