// SPDX-License-Identifier: MIT

package wgkey

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

// TestPublicKeyVector checks key derivation against RFC 7748 §6.1.
func TestPublicKeyVector(t *testing.T) {
	b, _ := hex.DecodeString("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
	priv, err := Parse(base64.StdEncoding.EncodeToString(b))
	if err != nil {
		t.Fatal(err)
	}
	got := priv.PublicKey().Hex()
	if want := "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"; got != want {
		t.Errorf("public key: got %s, want %s", got, want)
	}
}

func TestGenerateClamped(t *testing.T) {
	k, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if k[0]&7 != 0 || k[31]&128 != 0 || k[31]&64 == 0 {
		t.Errorf("key not clamped: %x", k)
	}
	back, err := Parse(k.String())
	if err != nil || back != k {
		t.Errorf("round trip: got %v, %v; want %v", back, err, k)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"not base64!", "want 32 bytes in standard base64"},
		{"", "want 32 bytes"},
		{base64.StdEncoding.EncodeToString(make([]byte, 31)), "want 32 bytes"},
		{base64.StdEncoding.EncodeToString(make([]byte, 32)), "all zero"},
		// Strict: a final character with stray low bits is not a key.
		{"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyB=", "want 32 bytes"},
		{strings.Repeat("A", 200), "…"},
	} {
		if _, err := Parse(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): got %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

// TestJSON checks that a Key is its base64 string in JSON and that
// decoding validates it.
func TestJSON(t *testing.T) {
	k, _ := Generate()
	type msg struct {
		Key Key `json:"key"`
	}
	b, err := json.Marshal(msg{k})
	if err != nil || string(b) != `{"key":"`+k.String()+`"}` {
		t.Fatalf("marshal: got %s, %v", b, err)
	}
	var m msg
	if err := json.Unmarshal(b, &m); err != nil || m.Key != k {
		t.Errorf("unmarshal: got %v, %v, want %v", m.Key, err, k)
	}
	for _, bad := range []string{`{"key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`, `{"key":"x"}`, `{"key":1}`} {
		if err := json.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("unmarshal %s: got nil error, want one", bad)
		}
	}
	if err := json.Unmarshal([]byte(`{}`), &m); err != nil {
		t.Errorf("unmarshal {}: %v", err)
	}
}
