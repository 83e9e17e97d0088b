// SPDX-License-Identifier: MIT

package store

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/airlock-vpn/airlock/internal/jointoken"
)

// tokenSecretBytes is the number of random bytes in a token.
const tokenSecretBytes = 32

// RestrictToken implements DB.
func (s *Store) RestrictToken(name string, r TokenRestrictions) (Token, error) {
	if err := r.Validate(); err != nil {
		return Token{}, fmt.Errorf("restrict token %q: %w", truncate(name), err)
	}
	var t Token
	err := s.db.Update(func(tx *bolt.Tx) error {
		tokens := tx.Bucket(bucketTokens)
		v := tokens.Get([]byte(name))
		if v == nil {
			return fmt.Errorf("token %q: %w", truncate(name), ErrNotFound)
		}
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decode token %q: %w", name, err)
		}
		t.From, t.Attest = r.From, r.Attest
		nv, err := json.Marshal(t)
		if err != nil {
			return err
		}
		return tokens.Put([]byte(name), nv)
	})
	if err != nil {
		return Token{}, fmt.Errorf("restrict token: %w", err)
	}
	t.Hash = nil
	return t, nil
}

// CreateToken makes a new random token named name, valid for ttl from now
// (ttl 0: never expires), stores only its SHA-256 and returns the clear
// token, which cannot be recovered later. An empty name gets a generated one
// of the form "tok-<8 hex digits>". A name in use fails with [ErrExists].
//
// The clear token is "alk1_" followed by 32 random bytes in unpadded
// base64url.
func (s *Store) CreateToken(name string, ttl time.Duration, now time.Time) (secret string, t Token, err error) {
	if ttl < 0 {
		return "", Token{}, fmt.Errorf("create token: negative ttl %s", ttl)
	}
	if name != "" {
		if err := ValidateTokenName(name); err != nil {
			return "", Token{}, fmt.Errorf("create token: %w", err)
		}
	}
	var raw [tokenSecretBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", Token{}, fmt.Errorf("create token: random: %w", err)
	}
	secret = TokenPrefix + base64.RawURLEncoding.EncodeToString(raw[:])
	t, err = s.storeToken(name, secret, ttl, now)
	if err != nil {
		return "", Token{}, fmt.Errorf("create token: %w", err)
	}
	return secret, t, nil
}

// storeToken stores the hash of secret as token name (generated if empty).
func (s *Store) storeToken(name, secret string, ttl time.Duration, now time.Time) (t Token, err error) {
	sum := sha256.Sum256([]byte(secret))
	t = Token{Hash: sum[:], Created: now.UTC()}
	if ttl > 0 {
		t.Expires = now.Add(ttl).UTC()
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		tokens := tx.Bucket(bucketTokens)
		t.Name = name
		if t.Name == "" {
			// Generated names: retry on the (unlikely) collision.
			for i := 0; ; i++ {
				n, err := generatedName()
				if err != nil {
					return err
				}
				if tokens.Get([]byte(n)) == nil {
					t.Name = n
					break
				}
				if i == 16 {
					return fmt.Errorf("cannot generate an unused token name")
				}
			}
		} else if tokens.Get([]byte(t.Name)) != nil {
			return fmt.Errorf("token %q: %w", t.Name, ErrExists)
		}
		v, err := json.Marshal(t)
		if err != nil {
			return err
		}
		if err := tokens.Put([]byte(t.Name), v); err != nil {
			return err
		}
		if tx.Bucket(bucketTokenHashes).Get(t.Hash) != nil {
			return fmt.Errorf("this token is already stored: %w", ErrExists)
		}
		return tx.Bucket(bucketTokenHashes).Put(t.Hash, []byte(t.Name))
	})
	return t, err
}

func generatedName() (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return "tok-" + hex.EncodeToString(b[:]), nil
}

// Tokens returns all tokens, expired ones included, sorted by name.
func (s *Store) Tokens() ([]Token, error) {
	var out []Token
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketTokens).ForEach(func(k, v []byte) error {
			var t Token
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("decode token %q: %w", k, err)
			}
			out = append(out, t)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return out, nil
}

// Token returns the stored record of the token named name (without its
// hash); it fails with [ErrNotFound] if there is none (never made, or
// revoked).
func (s *Store) Token(name string) (Token, error) {
	var t Token
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketTokens).Get([]byte(name))
		if v == nil {
			return fmt.Errorf("token %q: %w", truncate(name), ErrNotFound)
		}
		return json.Unmarshal(v, &t)
	})
	t.Hash = nil
	return t, err
}

// RevokeToken deletes the named token; it fails with [ErrNotFound] if there
// is none. Leases already granted with the token are not affected.
func (s *Store) RevokeToken(name string) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		tokens := tx.Bucket(bucketTokens)
		v := tokens.Get([]byte(name))
		if v == nil {
			return fmt.Errorf("token %q: %w", truncate(name), ErrNotFound)
		}
		var t Token
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decode token %q: %w", name, err)
		}
		if err := tx.Bucket(bucketTokenHashes).Delete(t.Hash); err != nil {
			return err
		}
		return tokens.Delete([]byte(name))
	})
	if err != nil {
		return fmt.Errorf("revoke token: %w", err)
	}
	return nil
}

// VerifyToken returns the record of the stored token whose clear text is
// secret if it has not expired at now. Otherwise it fails with an error
// wrapping [ErrBadToken], and also [ErrTokenExpired] if the token exists but
// has expired. Hashes are compared in constant time; the lookup is by hash,
// so timing reveals nothing about the secret.
func (s *Store) VerifyToken(secret string, now time.Time) (Token, error) {
	if !strings.HasPrefix(secret, TokenPrefix) {
		return Token{}, fmt.Errorf("verify token: %w: not an airlock token", ErrBadToken)
	}
	sum := sha256.Sum256([]byte(secret))
	var t Token
	err := s.db.View(func(tx *bolt.Tx) error {
		name := tx.Bucket(bucketTokenHashes).Get(sum[:])
		if name == nil {
			return fmt.Errorf("%w: unknown or revoked token", ErrBadToken)
		}
		v := tx.Bucket(bucketTokens).Get(name)
		if v == nil {
			return fmt.Errorf("%w: unknown or revoked token", ErrBadToken)
		}
		if err := json.Unmarshal(v, &t); err != nil {
			return fmt.Errorf("decode token %q: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return Token{}, fmt.Errorf("verify token: %w", err)
	}
	if subtle.ConstantTimeCompare(t.Hash, sum[:]) != 1 {
		return Token{}, fmt.Errorf("verify token: %w: hash index out of date", ErrBadToken)
	}
	if t.Expired(now) {
		return Token{}, fmt.Errorf("verify token %q: %w: %w at %s", t.Name, ErrBadToken, ErrTokenExpired, t.Expires.Format(time.RFC3339))
	}
	return t, nil
}

// The join token's model is internal/jointoken's; the store keeps these
// names for its callers.
type (
	// Token is [jointoken.Token].
	Token = jointoken.Token
	// TokenRestrictions is [jointoken.Restrictions].
	TokenRestrictions = jointoken.Restrictions
)

// TokenPrefix is [jointoken.Prefix].
const TokenPrefix = jointoken.Prefix

// ValidateTokenName is [jointoken.ValidateName].
func ValidateTokenName(name string) error { return jointoken.ValidateName(name) }

// truncate shortens s for error messages.
func truncate(s string) string { return jointoken.Truncate(s) }
