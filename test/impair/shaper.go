// SPDX-License-Identifier: MIT

package impair

import (
	"math/rand/v2"
	"time"
)

// Verdict is a Shaper's decision about one packet.
type Verdict struct {
	// Drop is why the packet is lost; DropNone means it is sent At.
	Drop Drop
	// At is when the packet leaves, on the clock of the times passed to
	// Decide. Packets must be sent in order of At, ties in arrival order.
	At time.Duration
	// Reordered reports that the packet skipped the delay.
	Reordered bool
}

// Drop is a reason for losing a packet.
type Drop uint8

// Reasons for losing a packet.
const (
	DropNone   Drop = iota
	DropRandom      // Dir.Loss
	DropBurst       // Dir.Burst
	DropQueue       // the rate queue was full
)

// Stats counts a Shaper's decisions.
type Stats struct {
	Packets, Bytes       uint64 // offered
	Random, Burst, Queue uint64 // dropped, by reason
	Reordered            uint64
}

// Shaper decides the fate of the packets of one direction. Not safe for
// concurrent use; use one per direction. Its zero value is not usable;
// make one with NewShaper.
type Shaper struct {
	d   Dir
	rng *rand.Rand

	bad       bool          // Gilbert–Elliott state
	busyUntil time.Duration // when the rate stage finishes the last accepted packet
	last      time.Duration // At of the last non-reordered packet (FIFO floor)
	queue     int           // the rate queue's limit in bytes

	stats Stats
}

// NewShaper returns the Shaper of direction d, with a PRNG seeded from seed
// and stream (use a different stream per direction).
func NewShaper(d Dir, seed, stream uint64) *Shaper {
	q := d.QueueBytes
	if q == 0 {
		q = DefaultQueueBytes
	}
	return &Shaper{d: d, rng: rand.New(rand.NewPCG(seed, stream^0x9e3779b97f4a7c15)), queue: q}
}

// Stats returns the counters so far.
func (s *Shaper) Stats() Stats { return s.stats }

// Decide returns the verdict for a packet of size bytes that arrives at
// now. Times must not go backwards between calls. The PRNG is drawn the
// same number of times for every packet whatever the outcome, so that one
// decision does not shift the random sequence of the next.
func (s *Shaper) Decide(now time.Duration, size int) Verdict {
	d := &s.d
	s.stats.Packets++
	s.stats.Bytes += uint64(size)
	// Fixed draws per packet: transition, burst loss, random loss,
	// reorder, jitter.
	uTrans, uBurst, uLoss, uReorder, uJitter := s.rng.Float64(), s.rng.Float64(), s.rng.Float64(), s.rng.Float64(), s.rng.Float64()

	if b := d.Burst; b != nil {
		if s.bad {
			if uTrans < b.R {
				s.bad = false
			}
		} else if uTrans < b.P {
			s.bad = true
		}
		p := b.LossGood
		if s.bad {
			p = b.LossBad
		}
		if uBurst < p {
			s.stats.Burst++
			return Verdict{Drop: DropBurst}
		}
	}
	if uLoss < d.Loss {
		s.stats.Random++
		return Verdict{Drop: DropRandom}
	}

	depart := now
	if d.Rate > 0 {
		start := max(now, s.busyUntil)
		backlog := int64(start-now) * d.Rate / 8 / int64(time.Second)
		if backlog+int64(size) > int64(s.queue) {
			s.stats.Queue++
			return Verdict{Drop: DropQueue}
		}
		s.busyUntil = start + time.Duration(int64(size)*8*int64(time.Second)/d.Rate)
		depart = s.busyUntil
	}

	if uReorder < d.Reorder && d.Delay > 0 {
		s.stats.Reordered++
		return Verdict{At: depart, Reordered: true}
	}
	delay := d.Delay
	if d.Jitter > 0 {
		delay += time.Duration((2*uJitter - 1) * float64(d.Jitter))
		delay = max(delay, 0)
	}
	at := max(depart+delay, s.last)
	s.last = at
	return Verdict{At: at}
}
