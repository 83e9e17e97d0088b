// SPDX-License-Identifier: MIT

package store

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

// NewTokenSecret returns a new random clear token: TokenPrefix followed by
// 32 random bytes in unpadded base64url.
func NewTokenSecret() (string, error) {
	var raw [tokenSecretBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:]), nil
}

// CheckTokenSecret returns an error wrapping ErrBadToken unless secret has
// the form NewTokenSecret makes; it returns secret without surrounding
// space.
func CheckTokenSecret(secret string) (string, error) {
	secret = strings.TrimSpace(secret)
	rest, ok := strings.CutPrefix(secret, TokenPrefix)
	if b, err := base64.RawURLEncoding.DecodeString(rest); !ok || err != nil || len(b) != tokenSecretBytes {
		return "", fmt.Errorf("%w: want %s followed by %d bytes in unpadded base64url, as airlock token create prints", ErrBadToken, TokenPrefix, tokenSecretBytes)
	}
	return secret, nil
}

// HashToken returns the SHA-256 of a clear token, the only form stores
// keep.
func HashToken(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// GenerateTokenName returns a name of the form "tok-<8 hex digits>" for a
// token created without one.
func GenerateTokenName() (string, error) { return generatedName() }

// Truncate shortens s for error messages.
func Truncate(s string) string { return truncate(s) }
