// SPDX-License-Identifier: MIT

package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Pending bans: a fleet gateway's bans that the shared database has not
// taken yet (it was unreachable when an admin banned). They hold on this
// gateway from the start, survive its restarts and the reloads of its
// replica (which replace the bans bucket with the database's), and the
// fleet node ships them, oldest first, once the database answers
// (internal/fleet).

// bucketPendingBans maps a sequence number (uint64, big-endian) → JSON
// Ban.
var bucketPendingBans = []byte("pending_bans")

// PendingBan is a ban waiting to be shipped.
type PendingBan struct {
	Seq uint64
	Ban Ban
}

// AddPendingBan keeps b until PendingBanDone.
func (s *Store) AddPendingBan(b Ban) error {
	if err := b.Valid(); err != nil {
		return fmt.Errorf("keep ban: %w", err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketPendingBans)
		seq, err := bk.NextSequence()
		if err != nil {
			return err
		}
		v, err := json.Marshal(b)
		if err != nil {
			return err
		}
		return bk.Put(binary.BigEndian.AppendUint64(nil, seq), v)
	})
	if err != nil {
		return fmt.Errorf("keep ban: %w", err)
	}
	return nil
}

// PendingBans returns the bans waiting to be shipped that are still in
// force at now, oldest first (those that ended are dropped).
func (s *Store) PendingBans(now time.Time) ([]PendingBan, error) {
	var out []PendingBan
	err := s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketPendingBans)
		var ended [][]byte
		err := bk.ForEach(func(k, v []byte) error {
			var b Ban
			if len(k) != 8 || json.Unmarshal(v, &b) != nil || !now.Before(b.Until) {
				ended = append(ended, append([]byte(nil), k...))
				return nil
			}
			out = append(out, PendingBan{Seq: binary.BigEndian.Uint64(k), Ban: b})
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range ended {
			if err := bk.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read pending bans: %w", err)
	}
	return out, nil
}

// PendingBanDone forgets pending ban seq (shipped).
func (s *Store) PendingBanDone(seq uint64) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPendingBans).Delete(binary.BigEndian.AppendUint64(nil, seq))
	})
	if err != nil {
		return fmt.Errorf("forget shipped ban: %w", err)
	}
	return nil
}
