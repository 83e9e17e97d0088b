// SPDX-License-Identifier: MIT

package control

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParsePin(t *testing.T) {
	const hexPin = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	const want = "sha256:" + hexPin
	colons := func(s string) string {
		var parts []string
		for i := 0; i < len(s); i += 2 {
			parts = append(parts, s[i:i+2])
		}
		return strings.Join(parts, ":")
	}
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: want, want: want},
		{in: hexPin, want: want},
		{in: "SHA256:" + strings.ToUpper(hexPin), want: want},
		{in: "  " + want + "\n", want: want},
		{in: "sha256:" + colons(strings.ToUpper(hexPin)), want: want},
		{in: "", wantErr: true},
		{in: "sha256:", wantErr: true},
		{in: "sha256:" + hexPin[:62], wantErr: true},
		{in: "sha256:" + hexPin + "00", wantErr: true},
		{in: "sha1:" + hexPin, wantErr: true},
		{in: "sha256:" + hexPin[:63] + "g", wantErr: true},
	}
	for _, tc := range tests {
		got, err := ParsePin(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParsePin(%q): got err %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if got != tc.want {
			t.Errorf("ParsePin(%q): got %q, want %q", tc.in, got, tc.want)
		}
		if err != nil && !strings.Contains(err.Error(), "join.env") {
			t.Errorf("ParsePin(%q): error %q does not say where the pin comes from", tc.in, err)
		}
	}
}

func TestLoadOrCreateIdentity(t *testing.T) {
	dir := t.TempDir()
	cert1, fp1, created, err := LoadOrCreateIdentity(dir, []string{"gw.example.org", "192.0.2.1", "2001:db8::1"})
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Errorf("first call: got created false, want true")
	}
	leaf := cert1.Leaf
	if got := strings.Join(leaf.DNSNames, ","); got != "gw.example.org" {
		t.Errorf("got DNS SANs %q, want gw.example.org", got)
	}
	if len(leaf.IPAddresses) != 2 {
		t.Errorf("got IP SANs %v, want 2", leaf.IPAddresses)
	}
	if d := time.Until(leaf.NotAfter); d < 9*365*24*time.Hour {
		t.Errorf("got validity %v, want about 10 years", d)
	}
	fi, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("got key mode %o, want 600", got)
	}

	_, fp2, created, err := LoadOrCreateIdentity(dir, []string{"other.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	if created {
		t.Errorf("second call: got created true, want false")
	}
	if fp1 != fp2 {
		t.Errorf("got fingerprint %s after reload, want %s", fp2, fp1)
	}

	// Fingerprint computed independently from the PEM file: SHA-256 of
	// the DER SubjectPublicKeyInfo, like the openssl pipeline in the doc.
	pemBytes, err := os.ReadFile(filepath.Join(dir, CertFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemBytes)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(c.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(spki)
	if want := "sha256:" + hex.EncodeToString(sum[:]); fp1 != want {
		t.Errorf("got fingerprint %s, want %s", fp1, want)
	}

	if _, err := exec.LookPath("openssl"); err == nil {
		cmd := exec.Command("sh", "-c", "openssl x509 -in \"$1\" -noout -pubkey | openssl pkey -pubin -outform DER | openssl dgst -sha256 -r", "sh", filepath.Join(dir, CertFile))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("openssl: %v", err)
		}
		if got := "sha256:" + strings.Fields(string(out))[0]; got != fp1 {
			t.Errorf("openssl computes %s, want %s", got, fp1)
		}
	}

	// Half an identity is an error, never silently replaced.
	if err := os.Remove(filepath.Join(dir, CertFile)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := LoadOrCreateIdentity(dir, nil); err == nil {
		t.Errorf("key without certificate: got nil error, want one")
	}
}

func TestDurationJSON(t *testing.T) {
	b, err := json.Marshal(Duration(90 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `"1m30s"`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{in: `"30s"`, want: 30 * time.Second},
		{in: `"1m30s"`, want: 90 * time.Second},
		{in: `"0s"`, want: 0},
		{in: `30`, wantErr: true},
		{in: `"30"`, wantErr: true},
		{in: `null`, wantErr: true},
	}
	for _, tc := range tests {
		var d Duration
		err := json.Unmarshal([]byte(tc.in), &d)
		if (err != nil) != tc.wantErr {
			t.Errorf("Unmarshal(%s): got err %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && d.Std() != tc.want {
			t.Errorf("Unmarshal(%s): got %v, want %v", tc.in, d, tc.want)
		}
	}
}
