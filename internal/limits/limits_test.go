// SPDX-License-Identifier: MIT

package limits

import (
	"testing"
)

func TestParseRate(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		bad  bool
	}{
		{"", 0, false},
		{"0", 0, false},
		{"100mbit", 100e6, false},
		{"100Mbit", 100e6, false},
		{"1gbit", 1e9, false},
		{"2.5gbit", 2.5e9, false},
		{"500kbit", 500e3, false},
		{"800000", 800e3, false},
		{"800000bit", 800e3, false},
		{"10MB", 80e6, false},
		{"10mbps", 10e6, false},
		{" 1 gbit ", 1e9, false},
		{"1tbit", 1e12, false},
		{"mbit", 0, true},
		{"-5mbit", 0, true},
		{"100 furlongs", 0, true},
		{"1.2.3mbit", 0, true},
		{"1kbit", 0, true}, // below 8 kbit
		{"1e30gbit", 0, true},
	}
	for _, tc := range tests {
		got, err := ParseRate(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseRate(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatRate(t *testing.T) {
	for bps, want := range map[uint64]string{0: "unlimited", 100e6: "100mbit", 1e9: "1gbit", 2500e6: "2500mbit", 8e3: "8kbit", 12345: "12345bit"} {
		if got := FormatRate(bps); got != want {
			t.Errorf("FormatRate(%d) = %q, want %q", bps, got, want)
		}
		if bps != 0 {
			if back, err := ParseRate(FormatRate(bps)); err != nil || back != bps {
				t.Errorf("ParseRate(FormatRate(%d)) = %d, %v", bps, back, err)
			}
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := (Job{MaxFlows: -1}).Validate(); err == nil {
		t.Error("MaxFlows -1: want an error")
	}
	if err := (Job{NewFlowsPerSec: -1}).Validate(); err == nil {
		t.Error("NewFlowsPerSec -1: want an error")
	}
	if err := (Job{EgressBitsPerSec: 1e6, MaxFlows: 10, NewFlowsPerSec: 0.5}).Validate(); err != nil {
		t.Errorf("valid limits: %v", err)
	}
}
