// SPDX-License-Identifier: MIT

package control

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// pinPrefix starts every fingerprint.
const pinPrefix = "sha256:"

// Fingerprint returns the pin of cert: "sha256:" followed by the lowercase
// hex SHA-256 of the certificate's DER SubjectPublicKeyInfo. Pinning the
// public key rather than the certificate keeps the pin valid when the
// certificate is re-issued with the same key. The same value is printed by
//
//	openssl x509 -in tls.crt -noout -pubkey | openssl pkey -pubin -outform DER | openssl dgst -sha256
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return pinPrefix + hex.EncodeToString(sum[:])
}

// ParsePin validates a fingerprint given by a user and returns it in the
// canonical form "sha256:<64 lowercase hex digits>". It accepts the
// "sha256:" prefix in any case or no prefix, hex digits in any case, and
// colons between hex byte pairs as printed by `openssl dgst -c`.
func ParsePin(s string) (string, error) {
	v := strings.TrimSpace(s)
	if len(v) >= len(pinPrefix) && strings.EqualFold(v[:len(pinPrefix)], pinPrefix) {
		v = v[len(pinPrefix):]
	}
	if len(v) == 3*sha256.Size-1 && strings.Count(v, ":") == sha256.Size-1 {
		v = strings.ReplaceAll(v, ":", "")
	}
	b, err := hex.DecodeString(v)
	if err != nil || len(b) != sha256.Size {
		if s == "" {
			return "", errors.New("empty gateway pin: set AIRLOCK_PIN to the fingerprint in the admin's join.env (sha256:<64 hex digits>)")
		}
		return "", fmt.Errorf("invalid gateway pin %q: want \"sha256:\" followed by 64 hex digits, as in the admin's join.env", truncate(s, 100))
	}
	return pinPrefix + hex.EncodeToString(b), nil
}

// ClientTLSConfig returns a TLS 1.3 client configuration that accepts the
// gateway's certificate if and only if its public-key fingerprint equals
// one of pins (see [Fingerprint], [ParsePins]: one pin, or several joined
// by "|" while the gateway's key is rotated); certificate chains, names
// and validity dates are not checked, since the pin is the trust anchor.
// The ClientHello names the pins (rotate.go), so that a gateway holding
// two identities presents one the client trusts. A
// mismatch fails the handshake with a [*PinMismatchError] naming the
// fingerprints. An invalid pin makes every handshake fail; validate it
// first with [ParsePins].
func ClientTLSConfig(pin string) *tls.Config {
	want, pinErr := ParsePins(pin)
	protos := []string{"http/1.1"}
	for _, p := range want {
		protos = append(protos, pinHint(p))
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by the pin check in VerifyConnection
		NextProtos:         protos,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if pinErr != nil {
				return pinErr
			}
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("gateway presented no certificate: %w", ErrPinMismatch)
			}
			got := Fingerprint(cs.PeerCertificates[0])
			ok := 0
			for _, w := range want {
				ok |= subtle.ConstantTimeCompare([]byte(got), []byte(w))
			}
			if ok != 1 {
				return &PinMismatchError{Expected: pinSetString(want), Presented: got}
			}
			return nil
		},
	}
}

// truncate shortens untrusted or user-provided s for error messages.
func truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
