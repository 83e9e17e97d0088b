// SPDX-License-Identifier: MIT

// Package wgkey is Airlock's one WireGuard key type: a Curve25519 private
// or public key, parsed once where it enters (the control protocol's JSON,
// the state directory) and printed as standard base64 (wg(8), the control
// protocol) or hex (wireguard-go's UAPI).
package wgkey

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"

	"golang.org/x/crypto/curve25519"
)

// Len is the length of a WireGuard key in bytes.
const Len = 32

// Key is a WireGuard private or public key. The zero value is not a valid
// key: Parse and UnmarshalText refuse it, and IsZero tells a missing key.
// A Key is a value; it is safe to copy and compare.
type Key [Len]byte

// Generate returns a new random, clamped Curve25519 private key.
func Generate() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return Key{}, fmt.Errorf("generate key: %w", err)
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k, nil
}

// PublicKey returns the public key of private key k.
func (k Key) PublicKey() Key {
	var pub Key
	curve25519.ScalarBaseMult((*[32]byte)(&pub), (*[32]byte)(&k))
	return pub
}

// String returns the key in standard base64, as in wg(8) and the control
// protocol.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// Hex returns the key in the hex form of wireguard-go's UAPI.
func (k Key) Hex() string { return hex.EncodeToString(k[:]) }

// IsZero reports whether k is all zeros (no key).
func (k Key) IsZero() bool { return k == Key{} }

// ErrInvalid is wrapped by the errors of Parse and UnmarshalText.
var ErrInvalid = errors.New("invalid WireGuard key")

// Parse parses a WireGuard key: standard base64 of 32 bytes, not all zero.
// The error wraps ErrInvalid and quotes at most 60 bytes of s.
func Parse(s string) (Key, error) {
	var k Key
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != Len {
		return Key{}, fmt.Errorf("%w %q: want %d bytes in standard base64 (44 characters)", ErrInvalid, truncate(s, 60), Len)
	}
	copy(k[:], b)
	if k.IsZero() {
		return Key{}, fmt.Errorf("%w: all zero", ErrInvalid)
	}
	return k, nil
}

// MarshalText returns the key in standard base64, so that a Key is a JSON
// string.
func (k Key) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText parses a key as Parse does.
func (k *Key) UnmarshalText(b []byte) error {
	p, err := Parse(string(b))
	if err != nil {
		return err
	}
	*k = p
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
