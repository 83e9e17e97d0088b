// SPDX-License-Identifier: MIT

package control

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// handshake runs a TLS handshake between a server presenting ids and a
// client pinning pin, and returns the pin the server presented.
func handshake(t *testing.T, ids *Identities, pin string) (string, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		s.SetDeadline(time.Now().Add(10 * time.Second))
		srv := tls.Server(s, &tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: ids.GetCertificate, NextProtos: []string{"http/1.1"}})
		_ = srv.Handshake()
		srv.Close()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	cl := tls.Client(c, ClientTLSConfig(pin))
	err = cl.Handshake()
	cs := cl.ConnectionState()
	if len(cs.PeerCertificates) == 0 {
		return "", err
	}
	if err == nil && cs.NegotiatedProtocol != "http/1.1" {
		t.Errorf("negotiated %q, want http/1.1", cs.NegotiatedProtocol)
	}
	return Fingerprint(cs.PeerCertificates[0]), err
}

func TestKeyRotation(t *testing.T) {
	dir := t.TempDir()
	cur, oldPin, _, err := LoadOrCreateIdentity(dir, []string{"gw.example", "192.0.2.1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FinishRotation(dir); !errors.Is(err, ErrRotation) {
		t.Errorf("finish without a rotation: %v, want ErrRotation", err)
	}
	gotOld, newPin, err := StartRotation(dir)
	if err != nil || gotOld != oldPin || newPin == oldPin {
		t.Fatalf("StartRotation: %s %s %v", gotOld, newPin, err)
	}
	if _, _, err := StartRotation(dir); !errors.Is(err, ErrRotation) {
		t.Errorf("second StartRotation: %v, want ErrRotation", err)
	}
	next, err := LoadNextIdentity(dir)
	if err != nil || next == nil || Fingerprint(next.Leaf) != newPin {
		t.Fatalf("LoadNextIdentity: %v %v", next, err)
	}
	if strings.Join(next.Leaf.DNSNames, ",") != "gw.example" || len(next.Leaf.IPAddresses) != 1 {
		t.Errorf("next certificate names %v %v, want the current one's", next.Leaf.DNSNames, next.Leaf.IPAddresses)
	}
	if fi, err := os.Stat(filepath.Join(dir, NextKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("next key: %v %v, want mode 0600", fi, err)
	}

	ids := NewIdentities(cur, next)
	for _, tt := range []struct {
		name, pins, want string
		wantErr          bool
	}{
		{"old client, old pin", oldPin, oldPin, false},
		{"both pins", newPin + "," + oldPin, newPin, false},
		{"both pins, old first", oldPin + "|" + newPin, newPin, false},
		{"new pin only", newPin, newPin, false},
		{"wrong pin", "sha256:" + strings.Repeat("ab", 32), oldPin, true},
	} {
		got, err := handshake(t, ids, tt.pins)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("%s: presented %s, %v; want %s, error %v", tt.name, got, err, tt.want, tt.wantErr)
		}
		if tt.wantErr && !errors.Is(err, ErrPinMismatch) {
			t.Errorf("%s: %v, want ErrPinMismatch", tt.name, err)
		}
	}
	if h := ids.Handshakes(); h["current"] != 2 || h["next"] != 3 {
		t.Errorf("handshakes %v, want current 2, next 3", h)
	}

	// Finish: the next identity is the only one; old-pin clients fail.
	if got, err := FinishRotation(dir); err != nil || got != newPin {
		t.Fatalf("FinishRotation: %s %v", got, err)
	}
	cur2, pin2, created, err := LoadOrCreateIdentity(dir, nil)
	if err != nil || created || pin2 != newPin {
		t.Fatalf("after finish: %s created %v %v", pin2, created, err)
	}
	if n, err := LoadNextIdentity(dir); n != nil || err != nil {
		t.Errorf("next identity after finish: %v %v", n, err)
	}
	ids.Set(cur2, nil)
	if _, err := handshake(t, ids, oldPin); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("old pin after finish: %v, want ErrPinMismatch", err)
	}
	if got, err := handshake(t, ids, newPin+","+oldPin); err != nil || got != newPin {
		t.Errorf("both pins after finish: %s %v", got, err)
	}
}

func TestParsePins(t *testing.T) {
	a, b := "sha256:"+strings.Repeat("aa", 32), "sha256:"+strings.Repeat("bb", 32)
	for _, tt := range []struct {
		in   string
		want string
		err  bool
	}{
		{a, a, false},
		{a + "|" + b, a + " " + b, false},
		{a + "," + strings.ToUpper(b[7:]), a + " " + b, false},
		{a + "|" + a, a, false},
		{"", "", true},
		{a + "|nonsense", "", true},
		{strings.Repeat(a+"|"+b+"|", 5), a + " " + b, false},
	} {
		got, err := ParsePins(tt.in)
		if (err != nil) != tt.err || strings.Join(got, " ") != tt.want {
			t.Errorf("ParsePins(%q): got %v, %v; want %q, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}
