// SPDX-License-Identifier: MIT

package capture

import "sync"

// ring is a bounded byte FIFO of whole pcap records: many writers (the
// data path) put records whole or not at all, one reader peeks at the queued bytes and releases them once written. It
// never blocks a writer and never grows. Safe for concurrent use.
type ring struct {
	// wake has room for one value: a put that made the ring non-empty
	// leaves one for the reader.
	wake chan struct{}

	mu sync.Mutex
	// buf holds n bytes starting at r, wrapping at len(buf).
	buf  []byte
	r, n int
}

func newRing(size int) *ring {
	return &ring{buf: make([]byte, size), wake: make(chan struct{}, 1)}
}

// free is the room left; the caller holds mu.
func (q *ring) freeLocked() int { return len(q.buf) - q.n }

// putLocked appends the parts of one record if all fit; the caller holds
// mu.
func (q *ring) putLocked(parts ...[]byte) bool {
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	if total > q.freeLocked() {
		return false
	}
	for _, p := range parts {
		q.writeLocked(p)
	}
	return true
}

// writeLocked copies p at the tail; the caller checked the room.
func (q *ring) writeLocked(p []byte) {
	w := (q.r + q.n) % len(q.buf)
	c := copy(q.buf[w:], p)
	copy(q.buf, p[c:])
	q.n += len(p)
}

// signal wakes the reader.
func (q *ring) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// peek returns the queued bytes, in order, as up to two slices of the
// ring itself, without removing them: writers only write into the free
// part, so the one reader may use them without the lock until it calls
// release.
func (q *ring) peek() (a, b []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	end := q.r + q.n
	if end <= len(q.buf) {
		return q.buf[q.r:end], nil
	}
	return q.buf[q.r:], q.buf[:end-len(q.buf)]
}

// release removes the first n queued bytes (n at most what peek
// returned).
func (q *ring) release(n int) {
	q.mu.Lock()
	q.r = (q.r + n) % len(q.buf)
	q.n -= n
	q.mu.Unlock()
}

// reset empties the ring.
func (q *ring) reset() {
	q.mu.Lock()
	q.r, q.n = 0, 0
	q.mu.Unlock()
}
