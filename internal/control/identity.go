// SPDX-License-Identifier: MIT

package control

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-vpn/airlock/internal/statefile"
)

// File names of the gateway's TLS identity inside its state directory.
const (
	KeyFile  = "tls.key"
	CertFile = "tls.crt"
)

// certLifetime is the validity of a generated certificate. Clients pin the
// key, not a CA, so a long lifetime costs nothing.
const certLifetime = 10 * 365 * 24 * time.Hour

// LoadOrCreateIdentity returns the gateway's TLS certificate and its
// fingerprint (see [Fingerprint]) from dir/tls.key and dir/tls.crt. If
// neither file exists it makes an ECDSA P-256 key (mode 0600) and a
// self-signed certificate valid for 10 years whose subject alternative
// names are hosts (IP literals as IP SANs), and reports created = true.
// Existing files are reused as they are, even if hosts differ, so that the
// pin clients hold stays valid. If only one of the two files exists it
// fails rather than replace the other.
func LoadOrCreateIdentity(dir string, hosts []string) (cert tls.Certificate, fingerprint string, created bool, err error) {
	keyPath := filepath.Join(dir, KeyFile)
	certPath := filepath.Join(dir, CertFile)
	keyOK, err := statefile.Exists(keyPath)
	if err != nil {
		return tls.Certificate{}, "", false, fmt.Errorf("gateway identity: %w", err)
	}
	certOK, err := statefile.Exists(certPath)
	if err != nil {
		return tls.Certificate{}, "", false, fmt.Errorf("gateway identity: %w", err)
	}
	switch {
	case keyOK && certOK:
		cert, err = tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return tls.Certificate{}, "", false, fmt.Errorf("load gateway identity from %s: %w", dir, err)
		}
		if cert.Leaf == nil {
			if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
				return tls.Certificate{}, "", false, fmt.Errorf("parse %s: %w", certPath, err)
			}
		}
		return cert, Fingerprint(cert.Leaf), false, nil
	case keyOK != certOK:
		have, missing := keyPath, certPath
		if certOK {
			have, missing = certPath, keyPath
		}
		return tls.Certificate{}, "", false, fmt.Errorf("gateway identity: %s exists but %s does not: restore it, or remove %s to make a new identity (clients will need the new pin)", have, missing, have)
	}

	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, "", false, fmt.Errorf("create state dir: %w", err)
	}
	c, err := newIdentity(dir, KeyFile, CertFile, hosts)
	if err != nil {
		return tls.Certificate{}, "", false, err
	}
	return *c, Fingerprint(c.Leaf), true, nil
}

// newIdentity makes an ECDSA P-256 key (dir/keyFile, mode 0600) and a
// self-signed certificate for it valid for 10 years (dir/certFile) whose
// subject alternative names are hosts (IP literals as IP SANs).
func newIdentity(dir, keyFile, certFile string, hosts []string) (*tls.Certificate, error) {
	keyPath, certPath := filepath.Join(dir, keyFile), filepath.Join(dir, certFile)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate gateway key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "airlock gateway"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("create gateway certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode gateway key: %w", err)
	}
	// Key first: a crash in between leaves a key without a certificate,
	// which the next start reports instead of silently replacing.
	if err := statefile.WriteAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	if err := statefile.WriteAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse new certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
