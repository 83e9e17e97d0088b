// SPDX-License-Identifier: MIT

package store

import (
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Lease history writes (a join's record, a lease's end) must
// be on disk before the gateway answers, and a join storm brings hundreds
// a second: one transaction and fsync each would bound the storm by the
// disk. bbolt's Batch groups them, but it waits MaxBatchDelay (10 ms)
// before every commit, a lone one too: 20 ms added to every short job (its
// join and its release), which made `airlock run -- true` twice as slow
// (issue 26). groupCommit commits a write at once when no commit is in
// progress; the writes that arrive meanwhile are committed together right
// after it, in one transaction and one fsync. When commits follow each
// other (a storm: bbolt syncs twice per commit, and a join arrives every
// few milliseconds), the next commit waits busyLinger for more writes to
// share it. One job's join and release are two commits less than
// busyWithin apart when the job is short: a storm is two commits within
// busyWithin before the one to make (like PostgreSQL's commit_delay,
// which waits only with commit_siblings others active), so that a lone
// short job's release does not wait (it did: 3 ms of `airlock run --
// true`'s 34, issue 26).

// groupCommit runs write functions in as few bbolt transactions as
// possible without delaying any. It is safe for concurrent use; set db
// before use.
type groupCommit struct {
	db *bolt.DB

	mu    sync.Mutex
	queue []commitCall // guarded by mu: waiting for the next commit
	busy  bool         // guarded by mu: a drain goroutine runs
	ended [2]time.Time // guarded by mu: when the last two commits ended, the latest first
}

// busyLinger is how long a commit that follows two others within
// busyWithin waits for more writes: in a storm it halves the syncs, and
// a lone write, or a short job's release after its join, never waits.
const (
	busyLinger = 3 * time.Millisecond
	busyWithin = 20 * time.Millisecond
)

// commitCall is one write and where its result goes.
type commitCall struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// run runs fn in a write transaction, possibly with others, and returns
// its error (fn's own, or the commit's). fn may be called more than once
// (when another write of its batch fails, the batch is run again without
// that one), so it must be idempotent, as for bolt.DB.Batch.
func (g *groupCommit) run(fn func(*bolt.Tx) error) error {
	c := commitCall{fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if !g.busy {
		g.busy = true
		go g.drain()
	}
	g.mu.Unlock()
	return <-c.done
}

// drain commits the queue, batch after batch, until it is empty.
func (g *groupCommit) drain() {
	g.mu.Lock()
	for len(g.queue) > 0 {
		if g.stormLocked(time.Now()) {
			g.mu.Unlock()
			time.Sleep(busyLinger)
			g.mu.Lock()
		}
		batch := g.queue
		g.queue = nil
		g.mu.Unlock()
		g.commit(batch)
		g.mu.Lock()
		g.ended[1], g.ended[0] = g.ended[0], time.Now()
	}
	g.busy = false
	g.mu.Unlock()
}

// stormLocked reports whether a commit at now follows two others within
// busyWithin, and so should wait busyLinger for more writes.
func (g *groupCommit) stormLocked(now time.Time) bool {
	return !g.ended[1].IsZero() && now.Sub(g.ended[1]) < busyWithin
}

// commit runs batch in one transaction. A write that fails is taken out
// and run alone, so that it gets its own error and the others commit.
func (g *groupCommit) commit(batch []commitCall) {
	for len(batch) > 0 {
		failed := -1
		err := g.db.Update(func(tx *bolt.Tx) error {
			for i, c := range batch {
				if err := c.fn(tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			for _, c := range batch {
				c.done <- err
			}
			return
		}
		c := batch[failed]
		batch = append(batch[:failed:failed], batch[failed+1:]...)
		c.done <- g.db.Update(c.fn)
	}
}
