// SPDX-License-Identifier: MIT

package store

import (
	"errors"

	"github.com/airlock-vpn/airlock/internal/jointoken"
)

// Sentinel errors returned by [Store] methods, checked with errors.Is.
var (
	// ErrLocked means another process (usually a running gateway) holds
	// the state database open.
	ErrLocked = errors.New("state db is locked")
	// ErrNotFound means the named record does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists means a record with that name already exists.
	ErrExists = errors.New("already exists")
	// ErrInvalidName is [jointoken.ErrInvalidName].
	ErrInvalidName = jointoken.ErrInvalidName
	// ErrBadToken is [jointoken.ErrBad].
	ErrBadToken = jointoken.ErrBad
	// ErrTokenExpired is [jointoken.ErrExpired].
	ErrTokenExpired = jointoken.ErrExpired
	// ErrUnavailable is [jointoken.ErrUnavailable]: the store cannot
	// answer now.
	ErrUnavailable = jointoken.ErrUnavailable
	// ErrNotPermitted means the fleet's database refused the operation to
	// this host's database role: a gateway's role may not do an admin's
	// work (create tokens, lift bans, write capture tickets, write another
	// gateway's records).
	ErrNotPermitted = errors.New("not permitted to this database role")
)
