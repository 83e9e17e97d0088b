// SPDX-License-Identifier: MIT

package store

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, time.Second)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func TestCreateToken(t *testing.T) {
	secretRE := regexp.MustCompile(`^alk1_[A-Za-z0-9_-]{43}$`)
	tests := []struct {
		name     string
		ttl      time.Duration
		wantName string // "" means generated
		wantErr  error
		anyErr   bool
	}{
		{name: "ci", wantName: "ci"},
		{name: "a.b_c-D9", ttl: time.Hour, wantName: "a.b_c-D9"},
		{name: "", wantName: ""},
		{name: strings.Repeat("x", 64), wantName: strings.Repeat("x", 64)},
		{name: strings.Repeat("x", 65), wantErr: ErrInvalidName},
		{name: "bad name", wantErr: ErrInvalidName},
		{name: "bad/name", wantErr: ErrInvalidName},
		{name: "ü", wantErr: ErrInvalidName},
		{name: "neg", ttl: -time.Second, anyErr: true},
	}
	s, _ := openTemp(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			secret, tok, err := s.CreateToken(tc.name, tc.ttl, t0)
			if tc.wantErr != nil || tc.anyErr {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
					t.Fatalf("got err %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("CreateToken: %v", err)
			}
			if !secretRE.MatchString(secret) {
				t.Errorf("got secret %q, want alk1_ + 43 base64url chars", secret)
			}
			if tc.wantName == "" {
				if !regexp.MustCompile(`^tok-[0-9a-f]{8}$`).MatchString(tok.Name) {
					t.Errorf("got generated name %q, want tok-<8 hex>", tok.Name)
				}
			} else if tok.Name != tc.wantName {
				t.Errorf("got name %q, want %q", tok.Name, tc.wantName)
			}
			if tc.ttl == 0 && !tok.Expires.IsZero() {
				t.Errorf("got expires %v, want zero", tok.Expires)
			}
			if tc.ttl > 0 && !tok.Expires.Equal(t0.Add(tc.ttl)) {
				t.Errorf("got expires %v, want %v", tok.Expires, t0.Add(tc.ttl))
			}
			got, err := s.VerifyToken(secret, t0)
			if err != nil {
				t.Fatalf("VerifyToken: %v", err)
			}
			if got.Name != tok.Name {
				t.Errorf("got verified name %q, want %q", got.Name, tok.Name)
			}
		})
	}
}

func TestCreateTokenDuplicate(t *testing.T) {
	s, _ := openTemp(t)
	if _, _, err := s.CreateToken("dup", 0, t0); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.CreateToken("dup", 0, t0)
	if !errors.Is(err, ErrExists) {
		t.Fatalf("got %v, want ErrExists", err)
	}
}

func TestVerifyToken(t *testing.T) {
	s, _ := openTemp(t)
	good, _, err := s.CreateToken("good", 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	short, _, err := s.CreateToken("short", time.Minute, t0)
	if err != nil {
		t.Fatal(err)
	}
	revoked, _, err := s.CreateToken("revoked", 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeToken("revoked"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		secret      string
		now         time.Time
		wantName    string
		wantExpired bool
		wantBad     bool
	}{
		{"good", good, t0.Add(100 * 365 * 24 * time.Hour), "good", false, false},
		{"short before expiry", short, t0.Add(59 * time.Second), "short", false, false},
		{"short at expiry", short, t0.Add(time.Minute), "", true, true},
		{"revoked", revoked, t0, "", false, true},
		{"empty", "", t0, "", false, true},
		{"no prefix", strings.TrimPrefix(good, TokenPrefix), t0, "", false, true},
		{"altered", good[:len(good)-1] + "A", t0, "", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "altered" && strings.HasSuffix(good, "A") {
				tc.secret = good[:len(good)-1] + "B"
			}
			tok, err := s.VerifyToken(tc.secret, tc.now)
			if got := errors.Is(err, ErrBadToken); got != tc.wantBad {
				t.Fatalf("got errors.Is(%v, ErrBadToken) = %v, want %v", err, got, tc.wantBad)
			}
			if got := errors.Is(err, ErrTokenExpired); got != tc.wantExpired {
				t.Errorf("got errors.Is(%v, ErrTokenExpired) = %v, want %v", err, got, tc.wantExpired)
			}
			if tok.Name != tc.wantName {
				t.Errorf("got name %q, want %q", tok.Name, tc.wantName)
			}
		})
	}
}

func TestRevokeToken(t *testing.T) {
	s, _ := openTemp(t)
	if _, _, err := s.CreateToken("a", 0, t0); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Token("a"); err != nil || got.Name != "a" || got.Hash != nil {
		t.Fatalf("Token(a): got %+v %v, want its record without hash", got, err)
	}
	if err := s.RevokeToken("a"); err != nil {
		t.Fatalf("RevokeToken: %v", err)
	}
	if _, err := s.Token("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Token(a) after revoke: got %v, want ErrNotFound", err)
	}
	if err := s.RevokeToken("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second revoke: got %v, want ErrNotFound", err)
	}
	toks, err := s.Tokens()
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 0 {
		t.Errorf("got %d tokens after revoke, want 0", len(toks))
	}
	// The name can be reused after revocation.
	if _, _, err := s.CreateToken("a", 0, t0); err != nil {
		t.Fatalf("recreate: %v", err)
	}
}

func TestPersistenceAndNoClearTokenOnDisk(t *testing.T) {
	s, path := openTemp(t)
	var secrets []string
	for _, n := range []string{"b", "a", "c"} {
		secret, _, err := s.CreateToken(n, time.Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		secrets = append(secrets, secret)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range secrets {
		body := strings.TrimPrefix(secret, TokenPrefix)
		if bytes.Contains(raw, []byte(body)) {
			t.Errorf("db file contains clear token %q", secret)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("got db mode %o, want 600", got)
	}

	s2, err := Open(path, time.Second)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	toks, err := s2.Tokens()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tok := range toks {
		names = append(names, tok.Name)
	}
	if got, want := strings.Join(names, ","), "a,b,c"; got != want {
		t.Errorf("got tokens %s, want %s", got, want)
	}
	for _, secret := range secrets {
		if _, err := s2.VerifyToken(secret, t0); err != nil {
			t.Errorf("VerifyToken after reopen: %v", err)
		}
	}
}

func TestOpenLocked(t *testing.T) {
	_, path := openTemp(t)
	start := time.Now()
	_, err := Open(path, 50*time.Millisecond)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("got %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "is a gateway running with this --state?") {
		t.Errorf("got message %q, want a hint about a running gateway", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("second Open took %v, want about the timeout", d)
	}
}

func TestConcurrent(t *testing.T) {
	s, _ := openTemp(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			secret, tok, err := s.CreateToken("", 0, t0)
			if err != nil {
				t.Error(err)
				return
			}
			if _, err := s.VerifyToken(secret, t0); err != nil {
				t.Error(err)
			}
			if _, err := s.Tokens(); err != nil {
				t.Error(err)
			}
			if err := s.RevokeToken(tok.Name); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// TestRestrictToken sets a token's source networks and attestation
// requirement: they are stored, verified joins see them, and a bad
// network or an unknown token is refused.
func TestRestrictToken(t *testing.T) {
	s, _ := openTemp(t)
	secret, _, err := s.CreateToken("site", 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	from := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("2001:db8:1::/48")}
	got, err := s.RestrictToken("site", TokenRestrictions{From: from, Attest: true})
	if err != nil || len(got.From) != 2 || !got.Attest || got.Hash != nil {
		t.Fatalf("RestrictToken: %+v %v", got, err)
	}
	v, err := s.VerifyToken(secret, t0)
	if err != nil || !v.Attest || len(v.From) != 2 {
		t.Fatalf("verified token %+v %v, want its restrictions", v, err)
	}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{{"10.1.2.3", true}, {"::ffff:10.1.2.3", true}, {"10.2.0.1", false}, {"2001:db8:1:5::1", true}, {"2001:db8:2::1", false}} {
		if got := v.AllowsFrom(netip.MustParseAddr(tc.addr)); got != tc.ok {
			t.Errorf("AllowsFrom(%s) = %v, want %v", tc.addr, got, tc.ok)
		}
	}
	if _, err := s.RestrictToken("site", TokenRestrictions{From: []netip.Prefix{netip.MustParsePrefix("10.1.2.3/16")}}); err == nil {
		t.Error("a network with host bits: accepted")
	}
	if _, err := s.RestrictToken("nosuch", TokenRestrictions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown token: %v, want ErrNotFound", err)
	}
	if got, _ := s.RestrictToken("site", TokenRestrictions{}); len(got.From) != 0 || got.Attest {
		t.Errorf("cleared restrictions: %+v", got)
	}
}
