// SPDX-License-Identifier: MIT

package device

import (
	"bytes"
	"runtime/pprof"
	"sync"
	"testing"
	"time"
)

// sequentialRoutines counts the goroutines running a peer's sequential
// sender or receiver.
func sequentialRoutines() int {
	var b bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&b, 2)
	return bytes.Count(b.Bytes(), []byte("device.(*Peer).RoutineSequentialSender(")) +
		bytes.Count(b.Bytes(), []byte("device.(*Peer).RoutineSequentialReceiver("))
}

// TestSequentialOnDemand: two started peers run no sequential routine
// until traffic comes (upstream: two each), the routines exit once idle
// for sequentialLinger, and traffic after that starts them again.
func TestSequentialOnDemand(t *testing.T) {
	goroutineLeakCheck(t)
	pair := genTestPair(t, true)
	if n := sequentialRoutines(); n != 0 {
		t.Fatalf("got %d sequential routines before any traffic, want 0", n)
	}
	pair.Send(t, Ping, nil)
	pair.Send(t, Pong, nil)
	idle := func() {
		t.Helper()
		deadline := time.Now().Add(sequentialLinger + 5*time.Second)
		for sequentialRoutines() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("got %d sequential routines %v after the traffic, want 0", sequentialRoutines(), sequentialLinger+5*time.Second)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	idle()
	for range 3 {
		pair.Send(t, Ping, nil)
		pair.Send(t, Pong, nil)
	}
	idle()
}

// TestNextOnDemand runs producers against one on-demand consumer whose
// linger is short enough that it exits and restarts between batches:
// every element arrives exactly once, each producer's in order, and at
// most one consumer runs at a time; the stop sentinel ends it.
func TestNextOnDemand(t *testing.T) {
	type item struct{ producer, seq int }
	const producers, per = 4, 2000
	var r onDemand
	r.stopped = make(chan struct{}, 1)
	c := make(chan *item, 8)
	var (
		mu      sync.Mutex
		got     = map[int]int{} // producer: next seq expected
		active  int
		maxSeen int
		starts  int
		wg      sync.WaitGroup
	)
	consume := func() {
		defer wg.Done()
		mu.Lock()
		active++
		starts++
		maxSeen = max(maxSeen, active)
		mu.Unlock()
		defer func() { mu.Lock(); active--; mu.Unlock() }()
		var timer *time.Timer
		for {
			e, more := nextOnDemand(&r, c, &timer, 50*time.Microsecond)
			if !more {
				return
			}
			mu.Lock()
			if e.seq != got[e.producer] {
				t.Errorf("producer %d: got element %d, want %d", e.producer, e.seq, got[e.producer])
			}
			got[e.producer] = e.seq + 1
			mu.Unlock()
		}
	}
	push := func(e *item) {
		c <- e
		if r.claim() {
			wg.Add(1)
			go consume()
		}
	}
	var pw sync.WaitGroup
	for p := range producers {
		pw.Add(1)
		go func() {
			defer pw.Done()
			for i := range per {
				push(&item{p, i})
				if i%100 == 0 {
					time.Sleep(time.Millisecond) // let the consumer exit
				}
			}
		}()
	}
	pw.Wait()
	push(nil)
	select {
	case <-r.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer did not take the stop sentinel")
	}
	wg.Wait()
	for p := range producers {
		if got[p] != per {
			t.Errorf("producer %d: %d elements arrived, want %d", p, got[p], per)
		}
	}
	if maxSeen != 1 {
		t.Errorf("got %d consumers at once, want 1", maxSeen)
	}
	if starts < 2 {
		t.Errorf("the consumer started %d times, want it to exit when idle and restart", starts)
	}
	t.Logf("%d consumer starts", starts)
}
