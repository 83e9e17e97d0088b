// SPDX-License-Identifier: MIT

package netstack

// Limits in user mode. Theory of operation:
//
// Bandwidth: every relayed TCP byte passes through halfCopy, which reads a
// chunk from one side and writes it to the other. A shaped direction takes
// the chunk's size from the job's token bucket (and the global one) after
// the read and sleeps off any debt before the write. Reading less often
// fills the socket's (host side) or endpoint's (netstack side) receive
// buffer, so the sender's TCP flow control, not drops, slows the flow. A
// bucket may go into debt by one chunk per flow; the long-run rate is
// exact, bursts are at most the bucket's burst plus one chunk per flow.
// UDP datagrams are taken from the same buckets without debt: a datagram
// the bucket cannot pay for is dropped and counted.
//
// Flows: each job counts its open TCP and UDP flows; a new flow beyond
// MaxFlows, or one its new-flow bucket (NewFlowsPerSec, burst ⌈rate⌉)
// cannot pay for, is refused before the host socket is dialled: TCP gets a
// reset, a UDP datagram is dropped. Inbound (exposed) flows and ICMP echo
// are not limited.
//
// Unlimited jobs never touch a bucket, so a limited job cannot slow them
// (only the global buckets are shared).

import (
	"fmt"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
)

const (
	// maxChunk is the most bytes a shaped direction relays per bucket
	// take: the relay buffer's size.
	maxChunk = copyBufSize
	// minChunk is the least, for slow rates.
	minChunk = 4 << 10
	// chunkTime is the time one chunk takes at the bucket's rate; chunks
	// are sized to it between minChunk and maxChunk.
	chunkTime = 20 * time.Millisecond
	// burstTime is how much idle time a byte bucket saves up, at least
	// one maximum chunk.
	burstTime = 20 * time.Millisecond
)

// bucket is a token bucket that may go into debt. rate is in tokens per
// second; a zero rate means unlimited, and then take and allow do not
// look at the balance. It is safe for concurrent use; the zero value is
// unlimited.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

// set changes the rate and burst. A bucket that was unlimited starts
// full.
func (b *bucket) set(now time.Time, rate, burst float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate == 0 {
		b.tokens = burst
	} else {
		b.refillLocked(now)
		b.tokens = math.Min(b.tokens, burst)
	}
	b.rate, b.burst, b.last = rate, burst, now
}

// limited reports whether the bucket has a rate.
func (b *bucket) limited() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rate > 0
}

func (b *bucket) refillLocked(now time.Time) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = math.Min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.last = now
	}
}

// take debits n tokens and returns how long the caller must wait until
// the balance is no longer negative (0: at once).
func (b *bucket) take(now time.Time, n float64) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate == 0 {
		return 0
	}
	b.refillLocked(now)
	b.tokens -= n
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// allow debits n tokens if the balance covers them and reports whether it
// did.
func (b *bucket) allow(now time.Time, n float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate == 0 {
		return true
	}
	b.refillLocked(now)
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// chunk returns how many bytes a shaped relay should read at a time.
func (b *bucket) chunk() int {
	b.mu.Lock()
	r := b.rate
	b.mu.Unlock()
	if r == 0 {
		return maxChunk
	}
	c := int(r * chunkTime.Seconds())
	return min(max(c, minChunk), maxChunk)
}

// setBits sets a byte bucket to bps bits per second (0: unlimited).
func (b *bucket) setBits(now time.Time, bps uint64) {
	rate := float64(bps) / 8
	b.set(now, rate, math.Max(rate*burstTime.Seconds(), maxChunk))
}

// jobLimits is one job's limits and flow count. It is safe for concurrent
// use.
type jobLimits struct {
	egress, ingress bucket // bytes: job → outside, outside → job
	newFlows        bucket // flows
	maxFlows        atomic.Int64
	flows           atomic.Int64 // open flows
}

// apply sets l.
func (j *jobLimits) apply(now time.Time, l limits.Job) {
	j.egress.setBits(now, l.EgressBitsPerSec)
	j.ingress.setBits(now, l.IngressBitsPerSec)
	j.newFlows.set(now, l.NewFlowsPerSec, math.Max(1, math.Ceil(l.NewFlowsPerSec)))
	j.maxFlows.Store(int64(l.MaxFlows))
}

// refusal says why admit refused a flow.
type refusal int

const (
	admitted refusal = iota
	tooManyFlows
	tooFast
)

// admit counts a new flow of the job unless its limits refuse it. A
// caller that was admitted calls release when the flow ends.
func (j *jobLimits) admit(now time.Time) refusal {
	for {
		n, max := j.flows.Load(), j.maxFlows.Load()
		if max > 0 && n >= max {
			return tooManyFlows
		}
		if j.flows.CompareAndSwap(n, n+1) {
			break
		}
	}
	if !j.newFlows.allow(now, 1) {
		j.flows.Add(-1)
		return tooFast
	}
	return admitted
}

func (j *jobLimits) release() { j.flows.Add(-1) }

// limitTable holds the global buckets and the limits' counters; each
// job's limits are in its jobState. It is safe for concurrent use; the
// zero value is unlimited.
type limitTable struct {
	globalEgress, globalIngress bucket

	flowsRefused, rateRefused, dropped atomic.Uint64
}

// SetJobLimits implements forward.Backend. Bandwidth limits apply to the
// job's open flows too; flow limits to its next flows (flows already open
// count towards MaxFlows, none is closed). The limits hold for the flows
// of all the job's addresses together.
func (s *Stack) SetJobLimits(id jobs.ID, l limits.Job) error {
	if err := l.Validate(); err != nil {
		return err
	}
	js, j, ok := s.jobs.get(id), forward.Job{}, false
	if js != nil {
		j, ok = s.reg.Get(id)
	}
	if !ok {
		return fmt.Errorf("user-mode egress: set limits of %s: %w", id, forward.ErrUnknownJob)
	}
	if err := s.setJobDNSLimits(j, dnsfwd.Limits{MaxInflight: l.DNSMaxInflight, PerSec: l.DNSQueriesPerSec}); err != nil {
		return err
	}
	js.lim.apply(time.Now(), l)
	return nil
}

// SetGlobalLimits implements forward.Backend.
func (s *Stack) SetGlobalLimits(egressBitsPerSec, ingressBitsPerSec uint64) error {
	now := time.Now()
	s.limits.globalEgress.setBits(now, egressBitsPerSec)
	s.limits.globalIngress.setBits(now, ingressBitsPerSec)
	return nil
}

// limitStats returns the limits' counters (Stats.Limits). Dropped counts UDP datagrams
// over a bandwidth limit; TCP is slowed, never dropped.
func (s *Stack) limitStats() limits.Stats {
	return limits.Stats{
		FlowsRefused: s.limits.flowsRefused.Load(),
		RateRefused:  s.limits.rateRefused.Load(),
		Dropped:      s.limits.dropped.Load(),
	}
}

// admitFlow applies the flow limits of the job at src to a new flow of
// proto towards dst. It returns the job's limits (nil for a job without
// any; the caller must call release on a non-nil result when the flow
// ends) and whether the flow may open. Refusals are counted and logged,
// rate-limited.
func (s *Stack) admitFlow(proto ipproto.Proto, src, dst netip.AddrPort) (*jobLimits, bool) {
	js := s.jobOf(src.Addr())
	if js == nil {
		return nil, true
	}
	j := js.lim
	why := j.admit(time.Now())
	switch why {
	case admitted:
		return j, true
	case tooManyFlows:
		s.limits.flowsRefused.Add(1)
		s.refuseFlow(proto, src, dst, flows.FlowLimit)
		if s.flowLog.Allow() {
			s.log.Warn("job's flow limit reached: new flow refused", "job", src.Addr(), "proto", proto, "dst", dst, "max_flows", j.maxFlows.Load())
		}
	case tooFast:
		s.limits.rateRefused.Add(1)
		s.refuseFlow(proto, src, dst, flows.NewFlowRate)
		if s.flowLog.Allow() {
			s.log.Warn("job opens flows too fast: new flow refused", "job", src.Addr(), "proto", proto, "dst", dst)
		}
	}
	return nil, false
}

// shaper paces one direction of one flow. The zero value and nil shape
// nothing. It is not safe for concurrent use.
type shaper struct {
	job, global *bucket
	done        <-chan struct{} // closed when the Stack closes
	timer       *time.Timer
}

// egressShaper and ingressShaper return the shapers of a flow of job j
// (nil: none) in each direction.
func (s *Stack) egressShaper(j *jobLimits) *shaper {
	return s.newShaper(j, func(j *jobLimits) *bucket { return &j.egress }, &s.limits.globalEgress)
}

func (s *Stack) ingressShaper(j *jobLimits) *shaper {
	return s.newShaper(j, func(j *jobLimits) *bucket { return &j.ingress }, &s.limits.globalIngress)
}

func (s *Stack) newShaper(j *jobLimits, dir func(*jobLimits) *bucket, global *bucket) *shaper {
	sh := &shaper{global: global, done: s.ctx.Done()}
	if j != nil {
		sh.job = dir(j)
	}
	return sh
}

// chunk returns how many bytes to read next: less than a full buffer at
// slow rates, so that one read does not become a long burst.
func (sh *shaper) chunk() int {
	if sh == nil {
		return maxChunk
	}
	c := sh.global.chunk()
	if sh.job != nil {
		c = min(c, sh.job.chunk())
	}
	return c
}

// wait takes n bytes from the buckets and sleeps off the debt. It returns
// false if the Stack closed meanwhile.
func (sh *shaper) wait(n int) bool {
	if sh == nil {
		return true
	}
	now := time.Now()
	d := sh.global.take(now, float64(n))
	if sh.job != nil {
		d = max(d, sh.job.take(now, float64(n)))
	}
	if d <= 0 {
		return true
	}
	if sh.timer == nil {
		sh.timer = time.NewTimer(d)
	} else {
		sh.timer.Reset(d)
	}
	select {
	case <-sh.timer.C:
		return true
	case <-sh.done:
		sh.timer.Stop()
		return false
	}
}

// allow reports whether a datagram of n bytes may pass, taking it from
// the buckets if so.
func (sh *shaper) allow(n int) bool {
	if sh == nil {
		return true
	}
	now := time.Now()
	if sh.job != nil && !sh.job.allow(now, float64(n)) {
		return false
	}
	return sh.global.allow(now, float64(n))
}
