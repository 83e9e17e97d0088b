// SPDX-License-Identifier: MIT

package impair

import (
	"math"
	"testing"
	"time"
)

// clock is a fake clock: packets arrive every step.
type clock struct {
	now, step time.Duration
}

func (c *clock) tick() time.Duration { c.now += c.step; return c.now }

func run(d Dir, seed uint64, n, size int, step time.Duration) []Verdict {
	s := NewShaper(d, seed, 1)
	c := &clock{step: step}
	out := make([]Verdict, n)
	for i := range out {
		out[i] = s.Decide(c.tick(), size)
	}
	return out
}

// within3Sigma reports whether k successes in n trials fit probability p.
func within3Sigma(k, n int, p float64) bool {
	mean := float64(n) * p
	sd := math.Sqrt(float64(n) * p * (1 - p))
	return math.Abs(float64(k)-mean) <= 3*sd
}

func TestLossRate(t *testing.T) {
	for _, p := range []float64{0, 0.001, 0.01, 0.05, 0.3} {
		const n = 200000
		v := run(Dir{Loss: p}, 42, n, 1500, time.Microsecond)
		k := 0
		for _, x := range v {
			if x.Drop == DropRandom {
				k++
			} else if x.Drop != DropNone {
				t.Fatalf("loss %v: drop reason %v, want random", p, x.Drop)
			}
		}
		if !within3Sigma(k, n, p) {
			t.Errorf("loss %v: %d of %d lost (%.4f%%), want %.4f%% ± 3σ", p, k, n, float64(k)/n*100, p*100)
		}
	}
}

func TestGilbertElliottBursts(t *testing.T) {
	ge := &GilbertElliott{P: 0.002, R: 0.25, LossGood: 0, LossBad: 1}
	const n = 500000
	v := run(Dir{Burst: ge}, 7, n, 1500, time.Microsecond)
	lost, bursts, runLen := 0, 0, 0
	var lens []int
	for _, x := range v {
		if x.Drop == DropBurst {
			lost++
			runLen++
			continue
		}
		if runLen > 0 {
			bursts++
			lens = append(lens, runLen)
			runLen = 0
		}
	}
	if bursts < 100 {
		t.Fatalf("%d bursts in %d packets; want ≥ 100", bursts, n)
	}
	mean := float64(lost) / float64(bursts)
	// Geometric burst length with mean 1/R = 4.
	if mean < 3.5 || mean > 4.5 {
		t.Errorf("mean burst length %.2f, want 4 ± 0.5 (1/R)", mean)
	}
	rate, want := float64(lost)/n, ge.P/(ge.P+ge.R)
	if math.Abs(rate-want) > 0.2*want {
		t.Errorf("long-run loss %.4f%%, want %.4f%% ± 20%% (P/(P+R))", rate*100, want*100)
	}
	long := 0
	for _, l := range lens {
		if l >= 8 {
			long++
		}
	}
	// P(len ≥ 8) = (1-R)^7 ≈ 13 %: bursts, not isolated losses.
	if f := float64(long) / float64(bursts); f < 0.08 || f > 0.18 {
		t.Errorf("%.1f%% of bursts ≥ 8 packets, want about 13%%", f*100)
	}
}

func TestDelayKeepsOrder(t *testing.T) {
	d := Dir{Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond}
	v := run(d, 3, 10000, 1500, 10*time.Microsecond)
	var last time.Duration
	for i, x := range v {
		arrive := time.Duration(i+1) * 10 * time.Microsecond
		if x.Drop != DropNone || x.Reordered {
			t.Fatalf("packet %d: %+v, want delayed only", i, x)
		}
		if x.At < last {
			t.Fatalf("packet %d leaves at %v before the one before it (%v): jitter must not reorder", i, x.At, last)
		}
		if dd := x.At - arrive; dd < 15*time.Millisecond || dd > 25*time.Millisecond+time.Millisecond {
			t.Fatalf("packet %d delayed %v, want 20 ms ± 5 ms", i, dd)
		}
		last = x.At
	}
	// Without jitter, exactly the delay.
	for i, x := range run(Dir{Delay: 20 * time.Millisecond}, 3, 100, 1500, time.Millisecond) {
		if want := time.Duration(i+1)*time.Millisecond + 20*time.Millisecond; x.At != want {
			t.Fatalf("packet %d at %v, want %v", i, x.At, want)
		}
	}
}

func TestReorderFraction(t *testing.T) {
	const n = 100000
	d := Dir{Delay: 20 * time.Millisecond, Reorder: 0.05}
	v := run(d, 11, n, 1500, 10*time.Microsecond)
	// Replay the release order through a Queue and count packets that
	// leave before one that arrived earlier.
	var q Queue[int]
	for i, x := range v {
		q.Push(x.At, i)
	}
	flagged, overtaking, maxSeen := 0, 0, -1
	for _, x := range v {
		if x.Reordered {
			flagged++
		}
	}
	for q.Len() > 0 {
		i, ok := q.PopDue(time.Hour)
		if !ok {
			t.Fatal("PopDue at the end of time: nothing due")
		}
		switch {
		case !v[i].Reordered && i < maxSeen:
			t.Fatalf("packet %d left after packet %d: only reordered packets may overtake", i, maxSeen)
		case !v[i].Reordered:
			maxSeen = i
		default:
			// Left while packets that arrived before it were still
			// being delayed?
			for j := i - 1; j >= 0 && j > i-50; j-- {
				if !v[j].Reordered && v[j].At > v[i].At {
					overtaking++
					break
				}
			}
		}
	}
	if !within3Sigma(flagged, n, 0.05) {
		t.Errorf("%d of %d reordered, want 5%% ± 3σ", flagged, n)
	}
	if overtaking != flagged {
		t.Errorf("%d reordered packets overtook earlier ones, want all %d (delay 20 ms ≫ spacing 10 µs)", overtaking, flagged)
	}
	// No delay: reordering has nothing to overtake.
	for _, x := range run(Dir{Reorder: 0.5}, 1, 1000, 1500, time.Microsecond) {
		if x.Reordered {
			t.Fatal("reordered without delay; want none")
		}
	}
}

func TestRateCap(t *testing.T) {
	// 100 Mbit/s, 1500-byte packets offered at 200 Mbit/s (every 60 µs)
	// for 1 s: half must be dropped by the 150 kB queue once it is full,
	// and the accepted ones leave 120 µs apart.
	d := Dir{Rate: 100e6, QueueBytes: 150000}
	v := run(d, 5, 16667, 1500, 60*time.Microsecond)
	sent, dropped := 0, 0
	var last time.Duration
	for i, x := range v {
		switch x.Drop {
		case DropNone:
			if sent > 0 && x.At-last < 120*time.Microsecond {
				t.Fatalf("packet %d leaves %v after the previous one, want ≥ 120 µs at 100 Mbit/s", i, x.At-last)
			}
			last = x.At
			sent++
		case DropQueue:
			dropped++
		default:
			t.Fatalf("packet %d: drop %v, want queue drops only", i, x.Drop)
		}
	}
	got := float64(sent) * 1500 * 8 / last.Seconds()
	if math.Abs(got-100e6) > 2e6 {
		t.Errorf("rate %.1f Mbit/s, want 100", got/1e6)
	}
	if f := float64(dropped) / float64(len(v)); f < 0.45 || f > 0.55 {
		t.Errorf("dropped %.1f%%, want about 50%%", f*100)
	}
	// Queueing delay is bounded by the queue: 150 kB at 100 Mbit/s = 12 ms.
	for i, x := range v {
		arrive := time.Duration(i+1) * 60 * time.Microsecond
		if x.Drop == DropNone && x.At-arrive > 12*time.Millisecond+120*time.Microsecond {
			t.Fatalf("packet %d waited %v, more than the 12 ms queue", i, x.At-arrive)
		}
	}
}

func TestDeterminism(t *testing.T) {
	d := Dir{Delay: 10 * time.Millisecond, Jitter: 2 * time.Millisecond, Loss: 0.02, Reorder: 0.03,
		Burst: &GilbertElliott{P: 0.01, R: 0.3, LossBad: 0.8}, Rate: 500e6}
	a := run(d, 99, 20000, 1200, 5*time.Microsecond)
	b := run(d, 99, 20000, 1200, 5*time.Microsecond)
	c := run(d, 100, 20000, 1200, 5*time.Microsecond)
	same := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("packet %d: %+v and %+v with the same seed; want equal", i, a[i], b[i])
		}
		if a[i] == c[i] {
			same++
		}
	}
	if same == len(a) {
		t.Error("seeds 99 and 100 gave identical decisions")
	}
	// The directions of one Config draw from different streams.
	up, down := NewShaper(d, 99, 1), NewShaper(d, 99, 2)
	diff := false
	for i := 0; i < 1000; i++ {
		now := time.Duration(i) * time.Millisecond
		if up.Decide(now, 100) != down.Decide(now, 100) {
			diff = true
		}
	}
	if !diff {
		t.Error("up and down made identical decisions; want independent streams")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		c  Config
		ok bool
	}{
		{Config{}, true},
		{Symmetric(40*time.Millisecond, 0.01), true},
		{Config{Up: Dir{Loss: 1.5}}, false},
		{Config{Down: Dir{Reorder: -0.1}}, false},
		{Config{Up: Dir{Delay: -time.Millisecond}}, false},
		{Config{Up: Dir{Burst: &GilbertElliott{P: 2}}}, false},
		{Config{Up: Dir{Rate: -1}}, false},
	} {
		if err := tc.c.Validate(); (err == nil) != tc.ok {
			t.Errorf("Validate(%v) = %v, want ok=%v", tc.c, err, tc.ok)
		}
	}
}

func TestQueueOrder(t *testing.T) {
	var q Queue[int]
	ats := []time.Duration{5, 1, 3, 3, 0, 9, 3}
	for i, at := range ats {
		q.Push(at, i)
	}
	if _, ok := q.PopDue(-1); ok {
		t.Fatal("PopDue before anything is due returned a packet")
	}
	var got []int
	for q.Len() > 0 {
		v, ok := q.PopDue(100)
		if !ok {
			t.Fatal("PopDue(100) found nothing due")
		}
		got = append(got, v)
	}
	want := []int{4, 1, 2, 3, 6, 0, 5} // by time, ties in push order
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
}

func TestDecideAllocs(t *testing.T) {
	s := NewShaper(Dir{Delay: time.Millisecond, Loss: 0.01, Reorder: 0.01, Rate: 1e9}, 1, 1)
	var q Queue[int32]
	now := time.Duration(0)
	for i := 0; i < 4096; i++ { // grow the heap first
		q.Push(time.Duration(i), int32(i))
	}
	for q.Len() > 0 {
		q.PopDue(time.Hour)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		now += time.Microsecond
		v := s.Decide(now, 1500)
		q.Push(v.At, 1)
		q.PopDue(now)
	})
	if allocs != 0 {
		t.Errorf("Decide+Push+PopDue: %v allocations per packet, want 0", allocs)
	}
}
