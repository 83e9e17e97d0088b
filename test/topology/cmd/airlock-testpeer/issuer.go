// SPDX-License-Identifier: MIT

package main

import (
	"crypto/tls"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/airlock-vpn/airlock/internal/bearer/bearertest"
)

// serveIssuer is a bearer token issuer's public side over HTTPS on addr:
// the discovery document and key set in dir (bearertest.Write), read at
// every request so that the test rotates keys by rewriting jwks.json,
// with dir's tls.crt and tls.key (signed by the test's own CA).
func serveIssuer(dir, addr string) error {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           bearertest.FileHandler(dir),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second,
	}
	return srv.ServeTLS(ln, "", "")
}
