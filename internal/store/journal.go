// SPDX-License-Identifier: MIT

package store

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The journal: with journaling on (EnableJournal), every change to the
// lease history — a start, an end — also appends the record as it now is
// to the journal bucket, in the same transaction (so with the same fsync)
// as the change. A fleet gateway acknowledges a join only after that
// commit, and a shipper (internal/fleet) copies journal entries, in
// order, to the shared database and deletes them once it has committed
// them there: a database outage or a kill -9 of the gateway loses no
// record, and the database gets each one at least once (its writes are
// idempotent).

// bucketJournal maps a sequence number (uint64, big-endian) → JSON
// LeaseRecord, without its resume state.
var bucketJournal = []byte("journal")

// JournalEntry is one journaled lease record.
type JournalEntry struct {
	Seq    uint64
	Record LeaseRecord
}

// EnableJournal makes every later change to the lease history append to
// the journal. Call it before the store is shared.
func (s *Store) EnableJournal() { s.journal = true }

// journalTx appends r to the journal if journaling is on.
func (s *Store) journalTx(tx *bolt.Tx, r LeaseRecord) error {
	if !s.journal {
		return nil
	}
	r.Resume = nil // resume state stays on the gateway's host
	b := tx.Bucket(bucketJournal)
	seq, err := b.NextSequence()
	if err != nil {
		return err
	}
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return b.Put(binary.BigEndian.AppendUint64(nil, seq), v)
}

// Journal returns up to max of the oldest journal entries.
func (s *Store) Journal(max int) ([]JournalEntry, error) {
	var out []JournalEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketJournal).Cursor()
		for k, v := c.First(); k != nil && len(out) < max; k, v = c.Next() {
			var e JournalEntry
			if len(k) != 8 {
				continue
			}
			e.Seq = binary.BigEndian.Uint64(k)
			if err := json.Unmarshal(v, &e.Record); err != nil {
				return fmt.Errorf("journal entry %d: %w", e.Seq, err)
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read journal: %w", err)
	}
	return out, nil
}

// JournalDone deletes the journal entries up to and including seq.
func (s *Store) JournalDone(seq uint64) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketJournal).Cursor()
		for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= seq; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("trim journal: %w", err)
	}
	return nil
}

// JournalLen returns how many entries wait in the journal.
func (s *Store) JournalLen() (int, error) {
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketJournal).Stats().KeyN
		return nil
	})
	return n, err
}

// metaFleet holds the fleet database a gateway of this state directory
// belongs to (its URL without password), set by the gateway.
var metaFleet = []byte("fleet")

// SetFleet records that this state directory's gateway is a member of
// the fleet whose database is db (a URL without password; "" for none):
// its tokens then live in the fleet's database, and admin commands that
// open this file while the gateway is stopped must not change them here.
func (s *Store) SetFleet(db string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if db == "" {
			return tx.Bucket(bucketMeta).Delete(metaFleet)
		}
		return tx.Bucket(bucketMeta).Put(metaFleet, []byte(db))
	})
}

// metaMemberID holds this state directory's fleet member id (MemberID).
var metaMemberID = []byte("member_id")

// MemberID returns this state directory's fleet member id, made (random)
// the first time it is asked for and kept here: the gateway's identity in
// the fleet's database (its member record, its leases, the kicks and
// captures addressed to it). It is not the gateway's pin, which a TLS key
// rotation changes; a restore of the state directory keeps it.
func (s *Store) MemberID() (string, error) {
	var id string
	err := s.db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(metaMemberID); v != nil {
			id = string(v)
			return nil
		}
		var b [12]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		id = "gw-" + hex.EncodeToString(b[:])
		return meta.Put(metaMemberID, []byte(id))
	})
	if err != nil {
		return "", fmt.Errorf("fleet member id: %w", err)
	}
	return id, nil
}

// Fleet returns what SetFleet recorded, "" for a single gateway.
func (s *Store) Fleet() (string, error) {
	var db string
	err := s.db.View(func(tx *bolt.Tx) error {
		db = string(tx.Bucket(bucketMeta).Get(metaFleet))
		return nil
	})
	return db, err
}
