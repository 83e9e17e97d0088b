// SPDX-License-Identifier: MIT

package store

import "errors"

// Sentinel errors returned by [Store] methods, checked with errors.Is.
var (
	// ErrLocked means another process (usually a running gateway) holds
	// the state database open.
	ErrLocked = errors.New("state db is locked")
	// ErrNotFound means the named record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists means a record with that name already exists.
	ErrExists = errors.New("already exists")
	// ErrInvalidName means a token name does not match [A-Za-z0-9._-]{1,64}.
	ErrInvalidName = errors.New("invalid name")
	// ErrBadToken means a presented token is unknown, revoked or expired.
	ErrBadToken = errors.New("bad token")
	// ErrTokenExpired means a presented token was valid but has expired.
	// Errors that match it also match ErrBadToken.
	ErrTokenExpired = errors.New("token expired")
	// ErrUnavailable means the store cannot answer now: a fleet's shared
	// database is unreachable, or a fail-closed gateway's copy of it is
	// too old to trust. The operation may succeed later.
	ErrUnavailable = errors.New("the fleet's database is unreachable")
	// ErrNotPermitted means the fleet's database refused the operation to
	// this host's database role: a gateway's role may not do an admin's
	// work (create tokens, lift bans, write capture tickets, write another
	// gateway's records).
	ErrNotPermitted = errors.New("not permitted to this database role")
)
