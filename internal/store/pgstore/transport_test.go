// SPDX-License-Identifier: MIT

package pgstore_test

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

// TestTransport: a --store URL that reaches the database over TCP must
// verify the server's certificate (verify-full, verify-ca, or require with
// a root certificate, which libpq treats as verify-ca); a unix socket
// needs nothing; --store-insecure allows the rest. No server is needed:
// the check is made on the parsed URL, before any connection.
func TestTransport(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.crt")
	writeOtherCA(t, ca)
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"postgres://gw@/airlock?host=/run/postgresql", true},
		{"host=/run/postgresql user=gw dbname=airlock sslmode=disable", true},
		{"postgres://gw@db.example.org/airlock?sslmode=verify-full&sslrootcert=" + ca, true},
		{"postgres://gw@db.example.org/airlock?sslmode=verify-ca&sslrootcert=" + ca, true},
		{"postgres://gw@db.example.org/airlock?sslmode=require&sslrootcert=" + ca, true},
		{"postgres://gw@db.example.org/airlock", false}, // prefer: plain-text fallback
		{"postgres://gw@db.example.org/airlock?sslmode=prefer&sslrootcert=" + ca, false},
		{"postgres://gw@db.example.org/airlock?sslmode=allow", false},
		{"postgres://gw@db.example.org/airlock?sslmode=disable", false},
		{"postgres://gw@db.example.org/airlock?sslmode=require", false},
		{"host=db.example.org user=gw dbname=airlock sslmode=require", false},
		{"postgres://gw@/airlock?host=/run/postgresql,db.example.org&sslmode=disable", false}, // a TCP host among sockets
	} {
		s, err := pgstore.OpenLazy(pgstore.Config{URL: tc.url})
		if s != nil {
			s.Close()
		}
		if ok := err == nil; ok != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.url, err, tc.ok)
		}
		if !tc.ok && !errors.Is(err, pgstore.ErrInsecureTransport) {
			t.Errorf("%s: %v, want ErrInsecureTransport", tc.url, err)
		}
		s, err = pgstore.OpenLazy(pgstore.Config{URL: tc.url, Insecure: true})
		if s != nil {
			s.Close()
		}
		if err != nil {
			t.Errorf("%s with --store-insecure: %v", tc.url, err)
		}
	}
}
