// SPDX-License-Identifier: MIT

package pgstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The connection to the fleet's database is authenticated: over TCP the
// server must prove who it is with a certificate that the URL's
// sslrootcert (or the system's roots) vouches for, sslmode=verify-full
// (name and chain) or verify-ca (chain only). Otherwise someone on the
// path to the database reads the fleet's token hashes and lease history
// and, worse, answers as the database: every token and ban the gateways
// trust, every member clients fail over to. A unix socket (host=/path)
// is local and needs no TLS. Config.Insecure (--store-insecure) is the
// site's explicit choice of a TCP connection without it.

// ErrInsecureTransport means a --store URL reaches the database over TCP
// without a verified TLS certificate and Config.Insecure is not set.
var ErrInsecureTransport = errors.New("the connection to the database is not authenticated")

// ErrTLSRefused means the server (or something on the path to it) did not
// complete TLS with a certificate the URL trusts: the connection was
// refused, not downgraded.
var ErrTLSRefused = errors.New("the database did not prove its identity over TLS")

// checkTransport refuses a connection configuration that would reach a
// TCP host without a verified certificate, or that falls back to one
// (sslmode=prefer or allow), unless insecure.
func checkTransport(pc *pgconn.Config, insecure bool) error {
	if insecure {
		return nil
	}
	check := func(host string, tc *tls.Config) error {
		if strings.HasPrefix(host, "/") || strings.HasPrefix(host, "@") {
			return nil // a unix socket (or an abstract one): local
		}
		if tc == nil {
			return fmt.Errorf("%w: host %s over TCP without TLS (or with a plain-text fallback: sslmode=prefer, allow or disable); use sslmode=verify-full&sslrootcert=CA.pem in --store, a unix socket (host=/run/postgresql), or say --store-insecure if the path to the database is trusted",
				ErrInsecureTransport, host)
		}
		if tc.InsecureSkipVerify && tc.VerifyPeerCertificate == nil {
			return fmt.Errorf("%w: host %s: TLS without checking the server's certificate (sslmode=require without sslrootcert); use sslmode=verify-full&sslrootcert=CA.pem in --store, or say --store-insecure if the path to the database is trusted",
				ErrInsecureTransport, host)
		}
		return nil
	}
	if err := check(pc.Host, pc.TLSConfig); err != nil {
		return err
	}
	for _, fb := range pc.Fallbacks {
		if err := check(fb.Host, fb.TLSConfig); err != nil {
			return err
		}
	}
	return nil
}

// tlsFailure returns err wrapped with ErrTLSRefused when it is a failure
// of the TLS handshake or of the server's certificate: what a server
// that is not the database, or a proxy that strips TLS, causes.
func tlsFailure(err error) error {
	if err == nil || errors.Is(err, ErrTLSRefused) {
		return err
	}
	s := err.Error()
	for _, sign := range []string{"server refused TLS connection", "tls: ", "x509: ", "certificate"} {
		if strings.Contains(s, sign) {
			return fmt.Errorf("%w (someone on the path to the database may be answering in its place, or the server's TLS is not set up; check --store's sslrootcert): %w", ErrTLSRefused, err)
		}
	}
	return err
}
