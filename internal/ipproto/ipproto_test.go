// SPDX-License-Identifier: MIT

package ipproto

import (
	"encoding/json"
	"testing"
)

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		p    Proto
		name string
		num  uint8
	}{{Any, "any", 0}, {ICMP, "icmp", 1}, {TCP, "tcp", 6}, {UDP, "udp", 17}} {
		if got := tc.p.String(); got != tc.name {
			t.Errorf("%d: got %q, want %q", tc.num, got, tc.name)
		}
		if uint8(tc.p) != tc.num {
			t.Errorf("%s: number %d, want the IANA number %d", tc.name, uint8(tc.p), tc.num)
		}
		if got, err := Parse(tc.name); err != nil || got != tc.p {
			t.Errorf("Parse(%q): got %v, %v, want %v", tc.name, got, err, tc.p)
		}
	}
	if got := Proto(47).String(); got != "47" {
		t.Errorf("GRE: got %q, want 47", got)
	}
	if got, err := Parse(""); err != nil || got != Any {
		t.Errorf(`Parse(""): got %v, %v, want any`, got, err)
	}
	for _, bad := range []string{"TCP", "sctp", "6", " tcp"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): got nil error, want one", bad)
		}
	}
}

func TestJSON(t *testing.T) {
	type rule struct {
		Proto Proto `json:"proto,omitempty"`
	}
	for _, tc := range []struct {
		p    Proto
		json string
	}{{Any, `{}`}, {TCP, `{"proto":"tcp"}`}, {ICMP, `{"proto":"icmp"}`}} {
		b, err := json.Marshal(rule{tc.p})
		if err != nil || string(b) != tc.json {
			t.Errorf("marshal %v: got %s, %v, want %s", tc.p, b, err, tc.json)
		}
		var r rule
		if err := json.Unmarshal([]byte(tc.json), &r); err != nil || r.Proto != tc.p {
			t.Errorf("unmarshal %s: got %v, %v, want %v", tc.json, r.Proto, err, tc.p)
		}
	}
	var r rule
	if err := json.Unmarshal([]byte(`{"proto":"gre"}`), &r); err == nil {
		t.Error(`unmarshal {"proto":"gre"}: got nil error, want one`)
	}
	if err := json.Unmarshal([]byte(`{"proto":""}`), &r); err != nil || r.Proto != Any {
		t.Errorf(`unmarshal {"proto":""}: got %v, %v, want any`, r.Proto, err)
	}
}
