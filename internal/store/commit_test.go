// SPDX-License-Identifier: MIT

package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestGroupCommit runs many writes at once: each gets its own result (a
// failing one its error, without taking the others of its batch down),
// every successful one is on disk, and they share fewer transactions than
// there are writes.
func TestGroupCommit(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	g := groupCommit{db: db}
	var mu sync.Mutex
	txs := map[*bolt.Tx]bool{}
	boom := errors.New("boom")
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.run(func(tx *bolt.Tx) error {
				mu.Lock()
				txs[tx] = true
				mu.Unlock()
				if i%50 == 7 {
					return fmt.Errorf("write %d: %w", i, boom)
				}
				return tx.Bucket([]byte("b")).Put([]byte(fmt.Sprint(i)), []byte{1})
			})
		}()
	}
	wg.Wait()
	err = db.View(func(tx *bolt.Tx) error {
		for i := range n {
			got := tx.Bucket([]byte("b")).Get([]byte(fmt.Sprint(i))) != nil
			if fails := i%50 == 7; fails != errors.Is(errs[i], boom) || got == fails {
				t.Errorf("write %d: error %v, stored %v", i, errs[i], got)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d writes in %d transactions", n, len(txs))
	if len(txs) >= n {
		t.Errorf("%d writes in %d transactions: none shared", n, len(txs))
	}
}

// TestGroupCommitStorm: a commit waits for more writes only after two
// others within busyWithin; a short job's release, one commit after its
// join, does not.
func TestGroupCommitStorm(t *testing.T) {
	now := time.Unix(1e9, 0)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, tc := range []struct {
		name  string
		ended [2]time.Time
		want  bool
	}{
		{"first commit", [2]time.Time{}, false},
		{"one commit just before (a short job's release)", [2]time.Time{ago(time.Millisecond)}, false},
		{"two commits within busyWithin", [2]time.Time{ago(time.Millisecond), ago(busyWithin - time.Millisecond)}, true},
		{"the older one busyWithin ago", [2]time.Time{ago(time.Millisecond), ago(busyWithin)}, false},
		{"both long ago", [2]time.Time{ago(time.Second), ago(2 * time.Second)}, false},
	} {
		g := groupCommit{ended: tc.ended}
		if got := g.stormLocked(now); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
