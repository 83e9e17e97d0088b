// SPDX-License-Identifier: MIT

package bearer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/bearer"
	"github.com/airlock-vpn/airlock/internal/bearer/bearertest"
)

// FuzzVerify feeds arbitrary tokens to a verifier of a real issuer (its
// keys fetched once). Invariants: no panic; an accepted token names the
// configured issuer and a printable subject, expires in the future and
// was signed by the issuer's key (the fuzzer cannot make one: only the
// seeds' own good token is accepted, unchanged).
func FuzzVerify(f *testing.F) {
	testKeys()
	iss, err := bearertest.Serve(f.TempDir(), rsaKey, ecKey)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { iss.Close() })
	v, err := bearer.New(bearer.Config{Issuers: []bearer.Issuer{{Name: "x", URL: iss.URL, CAFile: iss.CAFile}}, Audiences: []string{aud}}, quiet())
	if err != nil {
		f.Fatal(err)
	}
	good := ecKey.Sign(bearertest.Claims(iss.URL, "alice", aud, time.Hour, "compute.create"))
	f.Add(good)
	f.Add(rsaKey.Sign(bearertest.Claims(iss.URL, "bob", aud, -time.Hour, "")))
	f.Add(rsaKey.HMACWithPublicKey(bearertest.Claims(iss.URL, "eve", aud, time.Hour, "")))
	f.Add(bearertest.Unsigned("rsa1", bearertest.Claims(iss.URL, "eve", aud, time.Hour, "")))
	f.Add("e30.e30.")
	f.Add("..")
	f.Fuzz(func(t *testing.T, tok string) {
		id, err := v.Verify(context.Background(), tok)
		if err != nil {
			return
		}
		if strings.TrimSpace(tok) != good || id.Issuer != iss.URL || id.Subject != "alice" || !id.Expires.After(time.Now()) {
			t.Fatalf("accepted %q as %+v", tok, id)
		}
	})
}
