// SPDX-License-Identifier: MIT

// Package jointoken is the join token's model, shared by the layers that
// meet it: its record as a verifier returns it ([Token]: a name, the
// SHA-256 of the secret, its lifetime and restrictions), the form of its
// name and of its clear text, the errors a verifier reports, and the
// contract of one ([Verifier]). It stores nothing: internal/store keeps
// tokens (the state directory's database, or a fleet's shared one), the
// control server asks a Verifier, and the config names tokens.
package jointoken

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Prefix starts every clear join token, so that a token is recognizable
// in configuration files and secret scanners.
const Prefix = "alk1_"

// maxNameLen is the longest token name.
const maxNameLen = 64

// Errors a [Verifier] (and the stores that keep tokens) return, checked
// with errors.Is.
var (
	// ErrInvalidName means a token name does not match [A-Za-z0-9._-]{1,64}.
	ErrInvalidName = errors.New("invalid name")
	// ErrBad means a presented token is unknown, revoked or expired.
	ErrBad = errors.New("bad token")
	// ErrExpired means a presented token was valid but has expired.
	// Errors that match it also match ErrBad.
	ErrExpired = errors.New("token expired")
	// ErrUnavailable means the store that answers cannot answer now: a
	// fleet's shared database is unreachable, or a fail-closed gateway's
	// copy of it is too old to trust. The operation may succeed later.
	ErrUnavailable = errors.New("the fleet's database is unreachable")
)

// Verifier checks a presented join token. Implementations are safe for
// concurrent use.
type Verifier interface {
	// VerifyToken returns the record (without its hash) of the token
	// whose clear text is secret, or an error wrapping ErrBad if it is
	// unknown, revoked or expired at now, or ErrUnavailable if the store
	// cannot answer now.
	VerifyToken(secret string, now time.Time) (Token, error)
}

// Token is a join token's stored record. The clear token is never stored:
// only its SHA-256.
type Token struct {
	// Name identifies the token in admin commands and logs.
	Name string `json:"name"`
	// Hash is SHA-256 of the clear token.
	Hash []byte `json:"hash,omitempty"`
	// Created is when the token was made.
	Created time.Time `json:"created"`
	// Expires is when the token stops being accepted; zero means never.
	Expires time.Time `json:"expires,omitzero"`
	// From, if set, are the networks joins with the token may come from
	// (the client's address as the gateway sees it); others are refused.
	From []netip.Prefix `json:"from,omitempty"`
	// Attest requires every join with the token to carry a valid MUNGE
	// credential (the gateway's --attest).
	Attest bool `json:"attest,omitempty"`
}

// Restrictions are what a token's joins must meet besides the secret.
type Restrictions struct {
	// From, if set, are the networks joins may come from.
	From []netip.Prefix
	// Attest requires a MUNGE credential with every join.
	Attest bool
}

// Restrictions returns t's restrictions.
func (t Token) Restrictions() Restrictions {
	return Restrictions{From: t.From, Attest: t.Attest}
}

// Validate checks r: canonical prefixes, at most 64 of them.
func (r Restrictions) Validate() error {
	if len(r.From) > 64 {
		return fmt.Errorf("%d source networks, at most 64", len(r.From))
	}
	for _, p := range r.From {
		if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() {
			return fmt.Errorf("source network %v: want a network such as 10.1.0.0/16 (no host bits, no IPv4-mapped IPv6)", p)
		}
	}
	return nil
}

// AllowsFrom reports whether a join from addr may use t.
func (t Token) AllowsFrom(addr netip.Addr) bool {
	if len(t.From) == 0 {
		return true
	}
	addr = addr.Unmap()
	for _, p := range t.From {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// Expired reports whether t is no longer accepted at now.
func (t Token) Expired(now time.Time) bool {
	return !t.Expires.IsZero() && !now.Before(t.Expires)
}

// ValidateName returns an error wrapping [ErrInvalidName] unless name
// matches [A-Za-z0-9._-]{1,64}.
func ValidateName(name string) error {
	if len(name) == 0 || len(name) > maxNameLen {
		return fmt.Errorf("token name %q: %w: want 1 to %d characters from A-Z a-z 0-9 . _ -", Truncate(name), ErrInvalidName, maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("token name %q: %w: want 1 to %d characters from A-Z a-z 0-9 . _ -", Truncate(name), ErrInvalidName, maxNameLen)
		}
	}
	return nil
}

// Truncate shortens a name taken from outside to 80 bytes for an error
// message.
func Truncate(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
