// SPDX-License-Identifier: MIT

package store

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"
)

// ImportToken stores an existing token, made by CreateToken on another
// gateway, under name, so that jobs can use one token with several
// gateways. Like CreateToken it keeps only the SHA-256. A malformed secret
// fails with ErrBadToken; a name or token already stored with ErrExists.
func (s *Store) ImportToken(name, secret string, ttl time.Duration, now time.Time) (Token, error) {
	if ttl < 0 {
		return Token{}, fmt.Errorf("import token: negative ttl %s", ttl)
	}
	if name != "" {
		if err := ValidateTokenName(name); err != nil {
			return Token{}, fmt.Errorf("import token: %w", err)
		}
	}
	secret = strings.TrimSpace(secret)
	rest, ok := strings.CutPrefix(secret, TokenPrefix)
	if b, err := base64.RawURLEncoding.DecodeString(rest); !ok || err != nil || len(b) != tokenSecretBytes {
		return Token{}, fmt.Errorf("import token: %w: want %s followed by %d bytes in unpadded base64url, as airlock token create prints", ErrBadToken, TokenPrefix, tokenSecretBytes)
	}
	t, err := s.storeToken(name, secret, ttl, now)
	if err != nil {
		return Token{}, fmt.Errorf("import token: %w", err)
	}
	return t, nil
}
