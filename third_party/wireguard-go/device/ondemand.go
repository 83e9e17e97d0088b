// SPDX-License-Identifier: MIT

package device

import (
	"sync/atomic"
	"time"
)

// Airlock's patch: a peer's two sequential routines (RoutineSequentialSender
// and RoutineSequentialReceiver) run on demand. Upstream starts both when
// the peer starts and parks them on their queues until it stops; a gateway
// holds one peer per job, thousands of them idle, and each parked goroutine
// keeps its stack (the receiver's grows deep: it writes into the gateway's
// user-space network stack), the largest per-job item of an idle gateway.
//
// Here the first batch queued to an idle peer starts the routine
// (queueOutbound, queueInbound); the routine exits when its queue stayed
// empty for sequentialLinger. Exactly one routine per queue runs at a time
// (running), so batches keep their order. A routine that exits clears
// running and then looks at its queue once more, and a producer queues
// first and then sets running: between the two, a batch always finds a
// routine. Stop queues the nil that tells the routine to end, starts one
// if none runs, and waits until it ended (stopped), as upstream waits for
// both routines.

// sequentialLinger is how long an idle sequential routine waits for its
// next batch before it exits.
const sequentialLinger = time.Second

// onDemand is the state of one of a peer's sequential routines.
type onDemand struct {
	running atomic.Bool
	// stopped receives a value when the routine took the stop sentinel.
	stopped chan struct{}
}

// peerSequential is a peer's two on-demand sequential routines.
type peerSequential struct {
	send, receive onDemand
}

func (s *peerSequential) init() {
	s.send.stopped = make(chan struct{}, 1)
	s.receive.stopped = make(chan struct{}, 1)
}

// claim reports whether the caller must start the routine: none runs.
func (r *onDemand) claim() bool {
	return !r.running.Load() && r.running.CompareAndSwap(false, true)
}

// queueOutbound queues an encrypted batch for sending, in order, and
// starts the peer's sequential sender if it does not run.
func (peer *Peer) queueOutbound(c *QueueOutboundElementsContainer) {
	peer.queue.outbound.c <- c
	if peer.sequential.send.claim() {
		go peer.RoutineSequentialSender(peer.device.BatchSize())
	}
}

// queueInbound queues a batch being decrypted for writing to the TUN, in
// order, and starts the peer's sequential receiver if it does not run.
func (peer *Peer) queueInbound(c *QueueInboundElementsContainer) {
	peer.queue.inbound.c <- c
	if peer.sequential.receive.claim() {
		go peer.RoutineSequentialReceiver(peer.device.BatchSize())
	}
}

// stopSequential ends both sequential routines, as upstream's Stop did by
// queueing nil to each: it waits until each took its nil.
func (peer *Peer) stopSequential() {
	peer.queueInbound(nil)
	peer.queueOutbound(nil)
	<-peer.sequential.receive.stopped
	<-peer.sequential.send.stopped
}

// nextOnDemand returns the next batch of c for r's routine: at once, or
// within linger (sequentialLinger). more is false when the routine must
// exit: it took the stop sentinel (nil), or nothing came and r is no
// longer its to run. timer is the routine's own, made on first use.
func nextOnDemand[T any](r *onDemand, c chan *T, timer **time.Timer, linger time.Duration) (elem *T, more bool) {
	for {
		var e *T
		select {
		case e = <-c:
		default:
			if *timer == nil {
				*timer = time.NewTimer(linger)
			} else {
				(*timer).Reset(linger)
			}
			select {
			case e = <-c:
				(*timer).Stop()
			case <-(*timer).C:
				r.running.Store(false)
				if len(c) == 0 || !r.running.CompareAndSwap(false, true) {
					return nil, false
				}
				continue
			}
		}
		if e == nil {
			r.running.Store(false)
			r.stopped <- struct{}{}
			return nil, false
		}
		return e, true
	}
}
