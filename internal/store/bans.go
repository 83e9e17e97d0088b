// SPDX-License-Identifier: MIT

package store

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bucketBans maps a ban's id (uint64, big-endian, from the bucket's
// sequence) → JSON Ban.
var bucketBans = []byte("bans")

// AddBan stores b with a new id and returns it. Bans that ended are
// dropped on the way.
func (s *Store) AddBan(b Ban) (Ban, error) {
	if err := b.Valid(); err != nil {
		return Ban{}, fmt.Errorf("add ban: %w", err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bucketBans)
		if err := dropEndedBansTx(bk, b.Created); err != nil {
			return err
		}
		id, err := bk.NextSequence()
		if err != nil {
			return err
		}
		b.ID = int64(id)
		v, err := json.Marshal(b)
		if err != nil {
			return err
		}
		return bk.Put(binary.BigEndian.AppendUint64(nil, id), v)
	})
	if err != nil {
		return Ban{}, fmt.Errorf("add ban: %w", err)
	}
	return b, nil
}

// dropEndedBansTx deletes the bans that ended before now.
func dropEndedBansTx(bk *bolt.Bucket, now time.Time) error {
	var old [][]byte
	err := bk.ForEach(func(k, v []byte) error {
		var b Ban
		if json.Unmarshal(v, &b) != nil || b.Until.Before(now) {
			old = append(old, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range old {
		if err := bk.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// Bans returns the bans in force at now, oldest first.
func (s *Store) Bans(now time.Time) ([]Ban, error) {
	var out []Ban
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBans).ForEach(func(k, v []byte) error {
			var b Ban
			if err := json.Unmarshal(v, &b); err != nil {
				return fmt.Errorf("ban %x: %w", k, err)
			}
			if now.Before(b.Until) {
				out = append(out, b)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list bans: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ReplaceTokens makes toks (with their hashes) the store's tokens and bans
// the store's bans, in one transaction: a fleet gateway's local replica of
// the shared database (internal/fleet), so that joins are checked locally
// and go on while the database is unreachable.
func (s *Store) ReplaceTokens(toks []Token, bans []Ban) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketTokens, bucketTokenHashes, bucketBans} {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		tb, hb, bb := tx.Bucket(bucketTokens), tx.Bucket(bucketTokenHashes), tx.Bucket(bucketBans)
		for _, t := range toks {
			v, err := json.Marshal(t)
			if err != nil {
				return err
			}
			if err := tb.Put([]byte(t.Name), v); err != nil {
				return err
			}
			if err := hb.Put(t.Hash, []byte(t.Name)); err != nil {
				return err
			}
		}
		var maxID uint64
		for _, b := range bans {
			v, err := json.Marshal(b)
			if err != nil {
				return err
			}
			if err := bb.Put(binary.BigEndian.AppendUint64(nil, uint64(b.ID)), v); err != nil {
				return err
			}
			maxID = max(maxID, uint64(b.ID))
		}
		return bb.SetSequence(maxID)
	})
	if err != nil {
		return fmt.Errorf("replace tokens and bans: %w", err)
	}
	return nil
}
