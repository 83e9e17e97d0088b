// SPDX-License-Identifier: MIT

// Package store keeps the gateway's durable state in its state directory,
// a bbolt database (DIR/airlock.db) with join tokens,
// bans and the lease history that attributes outside connections to jobs
// (`airlock whois`); the small files beside it (keys, certificate,
// join.env) are written whole by internal/statefile. [DB] is the contract this database and the fleet's
// shared one (store/pgstore) both implement; a fleet member also keeps a
// replica of the fleet's tokens and bans here (ReplaceTokens) and a
// journal of its lease records (journal.go).
//
// A database file is held open by one process at a time. Open fails with
// [ErrLocked] after a short wait instead of blocking when a running gateway
// already holds it, so admin commands can fall back to the gateway's admin
// socket.
package store

import (
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// FileName is the database's file name inside the gateway's state directory.
const FileName = "airlock.db"

// defaultLockTimeout is used when Open is given a non-positive timeout.
const defaultLockTimeout = 100 * time.Millisecond

// Bucket names. Each is created by Open.
var (
	// bucketTokens maps token name → JSON tokenRecord.
	bucketTokens = []byte("tokens")
	// bucketTokenHashes maps SHA-256(secret) → token name.
	bucketTokenHashes = []byte("token_hashes")
)

// Store is the gateway's durable state. It is safe for concurrent use; its
// zero value is not usable: call [Open].
type Store struct {
	db   *bolt.DB
	path string
	// commits groups the lease history's writes (commit.go).
	commits groupCommit
	// journal makes lease history changes append to the journal
	// (journal.go); set before the store is shared.
	journal bool
}

// Open opens, or creates with mode 0600, the database at path. It waits at
// most timeout (100ms if timeout <= 0) for the file lock and then fails with
// an error wrapping [ErrLocked] that names the likely cause.
func Open(path string, timeout time.Duration) (*Store, error) {
	if timeout <= 0 {
		timeout = defaultLockTimeout
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: %w: is a gateway running with this --state?", path, ErrLocked)
		}
		return nil, fmt.Errorf("open state db %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketTokens, bucketTokenHashes, bucketLeases, bucketAttribution, bucketMeta, bucketBans, bucketJournal, bucketPendingBans} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("create bucket %q: %w", b, err)
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state db %s: %w", path, err)
	}
	return &Store{db: db, path: path, commits: groupCommit{db: db}}, nil
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

// Close releases the database and its file lock. Calls on a closed Store
// fail.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state db %s: %w", s.path, err)
	}
	return nil
}
