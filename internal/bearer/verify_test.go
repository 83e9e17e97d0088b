// SPDX-License-Identifier: MIT

package bearer_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/bearer"
	"github.com/airlock-vpn/airlock/internal/bearer/bearertest"
	"github.com/airlock-vpn/airlock/test/topology"
)

const aud = "https://gw.example.org"

var (
	keysOnce           sync.Once
	rsaKey, ecKey, k3  *bearertest.Key
	otherRSA, otherEC2 *bearertest.Key
)

func testKeys() {
	keysOnce.Do(func() {
		rsaKey, ecKey, k3 = bearertest.NewRSA("rsa1"), bearertest.NewEC("ec1"), bearertest.NewRSA("rsa2")
		otherRSA, otherEC2 = bearertest.NewRSA("rsa1"), bearertest.NewEC("ec1")
	})
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func setup(t *testing.T, mod func(*bearer.Config)) (*bearertest.Issuer, *bearer.Verifier, bearer.Config) {
	t.Helper()
	testKeys()
	dir := t.TempDir()
	iss, err := bearertest.Serve(dir, rsaKey, ecKey)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { iss.Close() })
	cfg := bearer.Config{
		Issuers:   []bearer.Issuer{{Name: "cms", URL: iss.URL, CAFile: iss.CAFile, Scopes: []string{"compute.create"}}},
		Audiences: []string{aud},
		CacheDir:  dir,
	}
	if mod != nil {
		mod(&cfg)
	}
	v, err := bearer.New(cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return iss, v, cfg
}

// TestVerify: each refusal the issue lists, and the valid tokens, signed
// by a real issuer's RSA and EC keys fetched over TLS with its own CA.
func TestVerify(t *testing.T) {
	iss, v, _ := setup(t, nil)
	good := func() map[string]any {
		return bearertest.Claims(iss.URL, "alice", aud, time.Hour, "compute.create storage.read:/cms", "/cms", "/cms/production")
	}
	with := func(k string, val any) map[string]any {
		c := good()
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	tests := []struct {
		name, tok string
		want      string // "" for accepted; else a part of the error
	}{
		{"rsa", rsaKey.Sign(good()), ""},
		{"ec", ecKey.Sign(good()), ""},
		{"aud list", rsaKey.Sign(with("aud", []string{"other", aud})), ""},
		{"expired", rsaKey.Sign(with("exp", time.Now().Add(-2*time.Minute).Unix())), "expired"},
		{"not yet valid", rsaKey.Sign(with("nbf", time.Now().Add(10*time.Minute).Unix())), "not valid yet"},
		{"no exp", rsaKey.Sign(with("exp", nil)), "no \"exp\""},
		{"no sub", rsaKey.Sign(with("sub", nil)), "\"sub\""},
		{"wrong audience", rsaKey.Sign(with("aud", "https://other.example.org")), "audience"},
		{"no audience", rsaKey.Sign(with("aud", nil)), "audience"},
		{"wrong issuer", rsaKey.Sign(with("iss", "https://evil.example.org")), "not one this gateway trusts"},
		{"forged rsa", otherRSA.Sign(good()), "does not verify"},
		{"forged ec", otherEC2.Sign(good()), "does not verify"},
		{"unknown kid", k3.Sign(good()), "no key \"rsa2\""},
		{"alg none", bearertest.Unsigned("rsa1", good()), "unsigned"},
		{"hs256 with public key", rsaKey.HMACWithPublicKey(good()), "HMAC"},
		{"ec key as rsa kid", ecKey.SignAs("rsa1", good()), "does not fit"},
		{"missing scope", rsaKey.Sign(with("scope", "storage.read:/cms")), "no scope \"compute.create\""},
		{"no scope claim", rsaKey.Sign(with("scope", nil)), "no scope"},
		{"garbage", "not.a.jwt", "not a JWT"},
		{"altered payload", alter(rsaKey.Sign(good())), "does not verify"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := v.Verify(context.Background(), tt.tok)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("got %v, want accepted", err)
				}
				if id.Issuer != iss.URL || id.Subject != "alice" || id.Name != "cms" || len(id.Groups) != 2 {
					t.Fatalf("got %+v", id)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want refusal with %q", tt.want)
			}
			if !errors.Is(err, bearer.ErrRefused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want ErrRefused with %q", err, tt.want)
			}
		})
	}
}

// alter flips the subject inside a signed token's payload.
func alter(tok string) string {
	parts := strings.Split(tok, ".")
	b, _ := decode(parts[1])
	b = []byte(strings.Replace(string(b), `"alice"`, `"mallory"`, 1))
	parts[1] = encode(b)
	return strings.Join(parts, ".")
}

// TestGroupsAndScopes: required groups (any of) and WLCG path scopes.
func TestGroupsAndScopes(t *testing.T) {
	iss, v, _ := setup(t, func(c *bearer.Config) {
		c.Issuers[0].Groups = []string{"/atlas", "/cms/production"}
		c.Issuers[0].Scopes = []string{"compute.create", "storage.read:/cms/store"}
	})
	for _, tt := range []struct {
		scope  string
		groups []string
		ok     bool
	}{
		{"compute.create storage.read:/cms", []string{"/cms/production"}, true},
		{"compute.create storage.read:/", []string{"/atlas"}, true},
		{"compute.create storage.read:/cms/store", []string{"/atlas"}, true},
		{"compute.create storage.read:/cmsx", []string{"/atlas"}, false},
		{"compute.create storage.read:/cms/store/sub", []string{"/atlas"}, false},
		{"compute.create storage.read:/cms", []string{"/cms"}, false},
		{"compute.create storage.read:/cms", nil, false},
	} {
		_, err := v.Verify(context.Background(), rsaKey.Sign(bearertest.Claims(iss.URL, "bob", aud, time.Hour, tt.scope, tt.groups...)))
		if (err == nil) != tt.ok {
			t.Errorf("scope %q groups %q: got %v, want ok %v", tt.scope, tt.groups, err, tt.ok)
		}
	}
}

// TestRotation: a token of a key the cached set does not hold makes the
// verifier refetch (the issuer rotated), at most once per MinRefetch.
func TestRotation(t *testing.T) {
	iss, v, _ := setup(t, func(c *bearer.Config) { c.MinRefetch = time.Hour })
	ctx := context.Background()
	if _, err := v.Verify(ctx, rsaKey.Sign(bearertest.Claims(iss.URL, "a", aud, time.Hour, "compute.create"))); err != nil {
		t.Fatal(err)
	}
	if got := iss.Fetches(); got != 1 {
		t.Fatalf("got %d fetches after the first token, want 1", got)
	}
	iss.SetKeys(ecKey, k3) // rotated: rsa1 withdrawn, rsa2 new
	// MinRefetch is an hour, but the first fetch was the first try:
	// the next unknown kid must wait for the hour.
	_, err := v.Verify(ctx, k3.Sign(bearertest.Claims(iss.URL, "a", aud, time.Hour, "compute.create")))
	if err == nil || iss.Fetches() != 1 {
		t.Fatalf("unknown kid within MinRefetch: got %v and %d fetches, want a refusal and no fetch", err, iss.Fetches())
	}

	iss2, v2, _ := setup(t, func(c *bearer.Config) { c.MinRefetch = time.Millisecond })
	if _, err := v2.Verify(ctx, rsaKey.Sign(bearertest.Claims(iss2.URL, "a", aud, time.Hour, "compute.create"))); err != nil {
		t.Fatal(err)
	}
	iss2.SetKeys(ecKey, k3)
	time.Sleep(2 * time.Millisecond)
	if _, err := v2.Verify(ctx, k3.Sign(bearertest.Claims(iss2.URL, "a", aud, time.Hour, "compute.create"))); err != nil {
		t.Fatalf("token of the new key: %v", err)
	}
	// Forged kids in a burst cost at most one fetch per MinRefetch.
	before := iss2.Fetches()
	for i := 0; i < 50; i++ {
		_, _ = v2.Verify(ctx, k3.SignAs("forged", bearertest.Claims(iss2.URL, "a", aud, time.Hour, "compute.create")))
	}
	if got := iss2.Fetches() - before; got > 50 {
		t.Fatalf("%d fetches for 50 forged kids", got)
	}
}

// TestIssuerDown: keys fetched (or cached on disk by an earlier run) keep
// verifying while the issuer is down, up to MaxStale; a verifier that
// never had them says the keys are unavailable.
func TestIssuerDown(t *testing.T) {
	iss, v, cfg := setup(t, func(c *bearer.Config) { c.Refresh = time.Millisecond; c.MinRefetch = time.Millisecond })
	ctx := context.Background()
	tok := func() string { return ecKey.Sign(bearertest.Claims(iss.URL, "a", aud, time.Hour, "compute.create")) }
	if _, err := v.Verify(ctx, tok()); err != nil {
		t.Fatal(err)
	}
	iss.SetDown(true)
	time.Sleep(5 * time.Millisecond)
	if _, err := v.Verify(ctx, tok()); err != nil {
		t.Fatalf("issuer down, keys fetched before: %v", err)
	}
	// A new verifier (a restarted gateway) reads the cache.
	v2, err := bearer.New(cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v2.Verify(ctx, tok()); err != nil {
		t.Fatalf("restarted, issuer down, cached keys: %v", err)
	}
	// Past MaxStale the cache is not used.
	cfg.MaxStale = time.Nanosecond
	v3, _ := bearer.New(cfg, quiet())
	if _, err := v3.Verify(ctx, tok()); !errors.Is(err, bearer.ErrUnavailable) {
		t.Fatalf("stale cache: got %v, want ErrUnavailable", err)
	}
	// Without a cache.
	cfg.MaxStale, cfg.CacheDir = 0, t.TempDir()
	v4, _ := bearer.New(cfg, quiet())
	if _, err := v4.Verify(ctx, tok()); !errors.Is(err, bearer.ErrUnavailable) {
		t.Fatalf("never fetched: got %v, want ErrUnavailable", err)
	}
	iss.SetDown(false)
	time.Sleep(2 * time.Millisecond)
	if _, err := v4.Verify(ctx, tok()); err != nil {
		t.Fatalf("issuer back: %v", err)
	}
	fi, err := os.Stat(filepath.Join(cfg.CacheDir))
	if err != nil || !fi.IsDir() {
		t.Fatal(err)
	}
}

// TestFirstFetchInFlight: a token that comes while the gateway's first
// fetch of its issuer's keys is under way waits for it, instead of being
// refused as "never fetched" (a gateway refused every job that joined in
// its first moments).
func TestFirstFetchInFlight(t *testing.T) {
	iss, v, _ := setup(t, nil)
	iss.SetDelay(300 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go v.Run(ctx)
	if !topology.Poll(5*time.Second, func() bool { return iss.Asked() > 0 }) {
		t.Fatal("the verifier did not ask for the issuer's keys")
	}
	tok := ecKey.Sign(bearertest.Claims(iss.URL, "a", aud, time.Hour, "compute.create"))
	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatalf("a token during the first fetch: %v, want it verified once the fetch is done", err)
	}
}

// TestTLSVerified: without the issuer's CA the keys are not fetched.
func TestTLSVerified(t *testing.T) {
	iss, v, _ := setup(t, func(c *bearer.Config) { c.Issuers[0].CAFile = "" })
	_, err := v.Verify(context.Background(), rsaKey.Sign(bearertest.Claims(iss.URL, "a", aud, time.Hour, "compute.create")))
	if !errors.Is(err, bearer.ErrUnavailable) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("got %v, want ErrUnavailable for an unverified certificate", err)
	}
}

func TestIssuerValidate(t *testing.T) {
	for _, tt := range []struct {
		iss  bearer.Issuer
		want string
	}{
		{bearer.Issuer{URL: "http://x"}, "https"},
		{bearer.Issuer{URL: ""}, "missing url"},
		{bearer.Issuer{URL: "https://x?q=1"}, "query"},
		{bearer.Issuer{URL: "https://x", Scopes: []string{"a b"}}, "scopes"},
		{bearer.Issuer{URL: "https://x/", Groups: []string{"/cms"}}, ""},
	} {
		err := tt.iss.Validate()
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%+v: got %v, want %q", tt.iss, err, tt.want)
		}
	}
}

func decode(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
func encode(b []byte) string          { return base64.RawURLEncoding.EncodeToString(b) }
