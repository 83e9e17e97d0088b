// SPDX-License-Identifier: MIT

package impair

import "time"

// Queue holds packets until their release time, in order of Verdict.At with
// ties in the order they were pushed. T is what the caller keeps per packet
// (a buffer index in the relay). It is a binary heap that allocates only
// when it grows. Not safe for concurrent use; the zero value is an empty
// queue.
type Queue[T any] struct {
	h   []entry[T]
	seq uint64
}

type entry[T any] struct {
	at  time.Duration
	seq uint64
	v   T
}

func (q *Queue[T]) less(i, j int) bool {
	if q.h[i].at != q.h[j].at {
		return q.h[i].at < q.h[j].at
	}
	return q.h[i].seq < q.h[j].seq
}

// Push adds v to leave at at.
func (q *Queue[T]) Push(at time.Duration, v T) {
	q.seq++
	q.h = append(q.h, entry[T]{at: at, seq: q.seq, v: v})
	for i := len(q.h) - 1; i > 0; {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

// Len returns the number of packets held.
func (q *Queue[T]) Len() int { return len(q.h) }

// Next returns the release time of the first packet; ok is false when the
// queue is empty.
func (q *Queue[T]) Next() (at time.Duration, ok bool) {
	if len(q.h) == 0 {
		return 0, false
	}
	return q.h[0].at, true
}

// PopDue removes and returns the first packet if it is due at now.
func (q *Queue[T]) PopDue(now time.Duration) (v T, ok bool) {
	if len(q.h) == 0 || q.h[0].at > now {
		return v, false
	}
	v = q.h[0].v
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h = q.h[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && q.less(l, m) {
			m = l
		}
		if r < n && q.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return v, true
}
