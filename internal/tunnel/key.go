// Package tunnel sets up the WireGuard data channel (wireguard-go) on both
// ends: the gateway's device with one peer per lease, and the client's device
// with the gateway as its only peer. It owns key handling: keys travel as
// standard base64 in the control protocol and as hex in wireguard-go's UAPI.
package tunnel

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"

	"golang.org/x/crypto/curve25519"
)

// KeyLen is the length of a WireGuard (Curve25519) key in bytes.
const KeyLen = 32

// Key is a WireGuard private or public key. The zero value is not a valid
// key.
type Key [KeyLen]byte

// GenerateKey returns a new random, clamped Curve25519 private key.
func GenerateKey() (Key, error) {
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

// hex returns the key in the hex form wireguard-go's UAPI expects.
func (k Key) hex() string { return hex.EncodeToString(k[:]) }

// IsZero reports whether k is all zeros.
func (k Key) IsZero() bool { return k == Key{} }

// ParseKey parses a standard-base64 WireGuard key.
func ParseKey(s string) (Key, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return Key{}, fmt.Errorf("parse key: %w", err)
	}
	if len(b) != KeyLen {
		return Key{}, fmt.Errorf("parse key: %d bytes, want %d", len(b), KeyLen)
	}
	var k Key
	copy(k[:], b)
	if k.IsZero() {
		return Key{}, fmt.Errorf("parse key: all-zero key")
	}
	return k, nil
}
