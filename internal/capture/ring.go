package capture

import "sync"

// ring is a bounded byte FIFO of whole pcap records: many writers (the
// data path) put records whole or not at all, one reader takes bytes. It
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

// take moves up to len(dst) bytes out of the ring into dst and returns
// how many.
func (q *ring) take(dst []byte) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(len(dst), q.n)
	c := copy(dst[:n], q.buf[q.r:min(len(q.buf), q.r+n)])
	copy(dst[c:n], q.buf)
	q.r = (q.r + n) % len(q.buf)
	q.n -= n
	return n
}

// reset empties the ring.
func (q *ring) reset() {
	q.mu.Lock()
	q.r, q.n = 0, 0
	q.mu.Unlock()
}
