// SPDX-License-Identifier: MIT

package dnsfwd

// Per-job limits. Every query is admitted against the limits of the job
// its source address belongs to (SetJob names all of a job's tunnel
// addresses, of both families, so a dual-stack job has one budget, not
// one per family; one Limiter is shared by the relays on each of the
// gateway's tunnel addresses): at most MaxInflight queries
// being relayed at once, and a token bucket of PerSec queries per second
// that holds up to max(PerSec, 1) queries. A query over either is answered
// REFUSED at once, never relayed. REFUSED rather than dropped: the job's
// resolver learns at once and moves on (a dropped query is retried after
// seconds, by every stub resolver, which makes a flooding job's load
// worse and a well-behaved job hang), and the answer is no larger than
// the query, to a source WireGuard authenticated, so nothing is amplified.
//
// Addresses of no job (Limiter.SetJob) get the defaults, each on its own.
// The table of sources is bounded (maxSources); idle addresses of no job
// are dropped when it fills.

import (
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of a job's DNS limits.
const (
	DefaultMaxInflight = 64
	DefaultPerSec      = 100
	// maxSources bounds the table of sources with state.
	maxSources = 65536
	// sourceIdle is how long a source without own limits and without
	// queries in flight keeps its state.
	sourceIdle = 30 * time.Second
)

// Limits are one job's DNS limits. A zero field takes its default
// (DefaultMaxInflight, DefaultPerSec); DNS is never unlimited.
type Limits struct {
	// MaxInflight caps the job's queries being relayed at once.
	MaxInflight int
	// PerSec caps the job's queries per second, in bursts of as many.
	PerSec float64
}

// Validate checks l.
func (l Limits) Validate() error {
	if l.MaxInflight < 0 || l.MaxInflight > 1<<20 {
		return fmt.Errorf("dns max in-flight %d: want 0 (default %d) to %d", l.MaxInflight, DefaultMaxInflight, 1<<20)
	}
	if l.PerSec < 0 || l.PerSec > 1e6 || math.IsNaN(l.PerSec) {
		return fmt.Errorf("dns queries per second %v: want 0 (default %d) to 1000000", l.PerSec, DefaultPerSec)
	}
	return nil
}

func (l Limits) resolved() Limits {
	if l.MaxInflight == 0 {
		l.MaxInflight = DefaultMaxInflight
	}
	if l.PerSec == 0 {
		l.PerSec = DefaultPerSec
	}
	return l
}

// source is one job's state (or one address's, for an address of no
// job), guarded by Limiter.mu.
type source struct {
	lim      Limits
	own      bool // a job's, set by SetJob: kept until RemoveJob
	bucket   *rate.Limiter
	inflight int
	conns    int // TCP connections open
	last     time.Time
}

// Limiter admits queries: the jobs' DNS limits and state, shared by every
// Server of one gateway (Config.Limiter). It is safe for concurrent use;
// the zero value is ready.
type Limiter struct {
	mu      sync.Mutex
	sources map[netip.Addr]*source // by each address of a job, one *source per job
}

// SetJob sets the DNS limits of the job with tunnel addresses addrs, which
// share one budget whatever the family a query comes over; a zero Limits
// restores the defaults. The state is kept until RemoveJob (an address
// dropped when idle would come back with a budget of its own). It may be
// called at any time, with the job's full address list each time.
func (l *Limiter) SetJob(addrs []netip.Addr, lim Limits) error {
	if err := lim.Validate(); err != nil {
		return err
	}
	l.setJob(addrs, lim, time.Now())
	return nil
}

func (l *Limiter) setJob(addrs []netip.Addr, lim Limits, now time.Time) {
	r := lim.resolved()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sources == nil {
		l.sources = make(map[netip.Addr]*source)
	}
	// One state for all the addresses: the first one's, with the queries
	// and connections the others already have in flight.
	var s *source
	for _, a := range addrs {
		o := l.sources[a.Unmap()]
		switch {
		case o == nil || o == s:
		case s == nil:
			s = o
		default:
			s.inflight += o.inflight
			s.conns += o.conns
		}
	}
	if s == nil {
		s = &source{last: now}
	}
	for _, a := range addrs {
		l.sources[a.Unmap()] = s
	}
	s.own = true
	if s.bucket == nil || s.lim != r {
		s.bucket = rate.NewLimiter(rate.Limit(r.PerSec), max(1, int(math.Ceil(r.PerSec))))
	}
	s.lim = r
}

// RemoveJob forgets the limits and state of the job with addresses addrs.
func (l *Limiter) RemoveJob(addrs []netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range addrs {
		delete(l.sources, a.Unmap())
	}
}

// Admission results.
const (
	admitted = iota
	overRate
	overInflight
)

// admit checks a query from a at now; if admitted, the caller must call
// done(a) when the query is answered.
func (l *Limiter) admit(a netip.Addr, now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sourceLocked(a.Unmap(), now)
	if s == nil {
		return overRate
	}
	s.last = now
	if s.inflight >= s.lim.MaxInflight {
		return overInflight
	}
	if !s.bucket.AllowN(now, 1) {
		return overRate
	}
	s.inflight++
	return admitted
}

// sourceLocked returns a's state, made with the defaults if it has none,
// or nil if the table is full. l.mu must be held.
func (l *Limiter) sourceLocked(a netip.Addr, now time.Time) *source {
	if l.sources == nil {
		l.sources = make(map[netip.Addr]*source)
	}
	s := l.sources[a]
	if s == nil {
		if len(l.sources) >= maxSources {
			l.sweepLocked(now)
		}
		if len(l.sources) >= maxSources {
			return nil
		}
		r := Limits{}.resolved()
		s = &source{lim: r, bucket: rate.NewLimiter(rate.Limit(r.PerSec), int(math.Ceil(r.PerSec)))}
		l.sources[a] = s
	}
	return s
}

// openConn admits a TCP connection from a at now: a job may hold as many
// open as it may have queries in flight (each connection is a goroutine
// of the relay, and its queries are admitted one by one besides). If it
// is admitted, the caller must call closeConn(a) when it closes.
func (l *Limiter) openConn(a netip.Addr, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sourceLocked(a.Unmap(), now)
	if s == nil || s.conns >= s.lim.MaxInflight {
		return false
	}
	s.conns++
	s.last = now
	return true
}

// closeConn ends an admitted TCP connection of a.
func (l *Limiter) closeConn(a netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources[a.Unmap()]; s != nil && s.conns > 0 {
		s.conns--
	}
}

// done ends an admitted query of a.
func (l *Limiter) done(a netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sources[a.Unmap()]; s != nil && s.inflight > 0 {
		s.inflight--
	}
}

// sweepLocked drops idle sources without own limits.
func (l *Limiter) sweepLocked(now time.Time) {
	for a, s := range l.sources {
		if !s.own && s.inflight == 0 && s.conns == 0 && now.Sub(s.last) > sourceIdle {
			delete(l.sources, a)
		}
	}
}
