package tunnel

import (
	"encoding/base64"
	"strings"
	"testing"
)

// TestPublicKeyVector checks key derivation against RFC 7748 §6.1.
func TestPublicKeyVector(t *testing.T) {
	priv, err := ParseKey(b64hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
	if err != nil {
		t.Fatal(err)
	}
	got := priv.PublicKey().hex()
	if want := "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"; got != want {
		t.Errorf("public key: got %s, want %s", got, want)
	}
}

func b64hex(h string) string {
	b := make([]byte, len(h)/2)
	for i := range b {
		var v byte
		for _, c := range h[2*i : 2*i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			default:
				v |= byte(c-'a') + 10
			}
		}
		b[i] = v
	}
	return base64.StdEncoding.EncodeToString(b)
}

func TestGenerateKeyClamped(t *testing.T) {
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if k[0]&7 != 0 || k[31]&128 != 0 || k[31]&64 == 0 {
		t.Errorf("key not clamped: %x", k)
	}
	back, err := ParseKey(k.String())
	if err != nil || back != k {
		t.Errorf("round trip: got %v, %v; want %v", back, err, k)
	}
}

func TestParseKeyErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"not base64!", "parse key"},
		{base64.StdEncoding.EncodeToString(make([]byte, 31)), "31 bytes"},
		{base64.StdEncoding.EncodeToString(make([]byte, 32)), "all-zero"},
	}
	for _, tt := range tests {
		_, err := ParseKey(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseKey(%q): got %v, want error containing %q", tt.in, err, tt.want)
		}
	}
}
