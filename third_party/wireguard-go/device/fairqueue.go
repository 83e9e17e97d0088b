// SPDX-License-Identifier: MIT

package device

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Airlock's patch: a fair, delay-bounded queue in front of the encryption
// workers, for a device with many peers (the gateway, one peer per job).
//
// # Theory of operation
//
// Upstream's TUN reader hands each peer's batch to the peer's sequential
// queue and to the device-wide encryption queue, and blocks when the
// peer's queue is full. On a gateway that is one reader for every job: a
// job whose bulk download fills its own queue stops the reader, packets
// for every other job wait in the TUN behind it, and every batch that
// does get through waits in the one encryption queue behind the bulk
// job's. A neighbour's round trip then grows by the bulk job's backlog.
//
// With SetFairQueue the reader never blocks on a peer. SendStagedPackets
// appends the peer's batch, stamped with the time, to the peer's own queue
// here (fqPeer) and returns. A scheduler, run by whichever goroutine
// enqueues or finishes a batch (no goroutine of its own), hands batches
// to the encryption workers and the peers' sequential senders:
//
//   - deficit round robin in bytes between the peers with packets queued
//     (a quantum of fqQuantum bytes per turn), so a peer with one packet
//     waits for at most one turn of each other busy peer, whatever their
//     backlog;
//   - at most fqUnit packets per hand-off (a larger batch is split) and at
//     most fqInflightPackets packets and fqInflightBatches batches handed
//     off and not yet sent, device-wide: the standing queue stays here,
//     per peer, not in the shared encryption queue or the socket;
//   - CoDel (RFC 8289) per peer on the time a packet waited here (its
//     sojourn time): once that stays above target for an interval, the
//     peer's packets are dropped at the head at the control law's rate
//     (interval/sqrt(count)), which tells the sender of that peer's flows
//     (the gateway's own TCP in user mode, the outside host in kernel
//     mode) to slow down, and only that sender;
//   - a hard limit of fqPeerLimit packets per peer: a batch that would
//     exceed it is dropped whole.
//
// Every drop is counted (FairQueueDrops). Dropped packets have their
// nonces already; the receiver's replay window accepts the gap, as it
// does any loss on the path. A batch handed off carries its packet count
// (QueueOutboundElementsContainer.fqPackets), returned to the budget when
// the batch goes back to its pool, on every path: sent, flushed, or
// drained with a stopped peer's queue.

// Fair queue parameters. fqUnit and fqInflightPackets bound what waits
// after the scheduler, shared by all peers: 256 packets of 1,420 bytes are
// 2.9 ms at 1 Gbit/s, 0.97 ms at 3 Gbit/s.
const (
	fqUnit             = 32
	fqInflightPackets  = 256
	fqInflightBatches  = 32 // < QueuePeerSize: a hand-off never blocks
	fqQuantum          = 64 << 10
	fqPeerLimit        = 2048
	DefaultCoDelTarget = 5 * time.Millisecond
	DefaultCoDelPeriod = 100 * time.Millisecond
)

// codel is RFC 8289's state for one queue. Times are nanoseconds of a
// monotonic clock. The zero value is an idle queue.
type codel struct {
	firstAbove int64 // when sojourn has been above target for an interval; 0: below
	dropNext   int64 // when to drop next while dropping
	count      uint32
	lastCount  uint32
	dropping   bool
}

// controlLaw returns t + interval/sqrt(count).
func controlLaw(t, interval int64, count uint32) int64 {
	return t + int64(float64(interval)/math.Sqrt(float64(count)))
}

// shouldDrop decides for a packet dequeued at now that waited sojourn,
// with backlog packets still queued behind it. It is RFC 8289's dequeue
// (dodequeue and the dropping state machine) one packet at a time.
func (c *codel) shouldDrop(now, sojourn int64, backlog int, target, interval int64) bool {
	okToDrop := false
	if sojourn < target || backlog == 0 {
		c.firstAbove = 0
	} else if c.firstAbove == 0 {
		c.firstAbove = now + interval
	} else if now >= c.firstAbove {
		okToDrop = true
	}
	if c.dropping {
		if !okToDrop {
			c.dropping = false
			return false
		}
		if now >= c.dropNext {
			c.count++
			c.dropNext = controlLaw(c.dropNext, interval, c.count)
			return true
		}
		return false
	}
	if !okToDrop {
		return false
	}
	c.dropping = true
	delta := c.count - c.lastCount
	c.count = 1
	if delta > 1 && now-c.dropNext < 16*interval {
		c.count = delta
	}
	c.dropNext = controlLaw(now, interval, c.count)
	c.lastCount = c.count
	return true
}

// idle resets the sojourn tracking of a queue that went empty.
func (c *codel) idle() {
	c.firstAbove = 0
	c.dropping = false
}

// fqPeer is a peer's queue in the fair queue, guarded by fairQueue.mu.
// Its zero value is an empty queue with no memory.
type fqPeer struct {
	batches []*QueueOutboundElementsContainer // FIFO, locked, stamped
	packets int
	deficit int
	active  bool
	codel   codel
}

// fairQueue is a device's fair queue (see above). It is off (nil peers
// pass straight through) until SetFairQueue; safe for concurrent use.
type fairQueue struct {
	on       atomic.Bool
	target   int64
	interval int64
	drops    atomic.Uint64
	now      func() int64 // monotonic nanoseconds; tests replace it

	mu              sync.Mutex
	active          []*Peer // round-robin order of peers with packets queued
	inflightPackets int
	inflightBatches int
}

// SetFairQueue turns the fair, delay-bounded send queue on (see
// fairqueue.go) with CoDel's target and interval, zero for RFC 8289's 5 ms
// and 100 ms. It is meant for a device with many peers (Airlock's
// gateway) and must be called before the device carries traffic; a
// device with SetRunToCompletion sends inline and ignores it.
func (device *Device) SetFairQueue(target, interval time.Duration) {
	if target <= 0 {
		target = DefaultCoDelTarget
	}
	if interval <= 0 {
		interval = DefaultCoDelPeriod
	}
	fq := &device.fq
	fq.mu.Lock()
	fq.target, fq.interval = int64(target), int64(interval)
	if fq.now == nil {
		epoch := time.Now()
		fq.now = func() int64 { return int64(time.Since(epoch)) }
	}
	fq.mu.Unlock()
	fq.on.Store(true)
}

// FairQueueDrops returns how many packets the fair queue dropped (CoDel
// and the per-peer limit).
func (device *Device) FairQueueDrops() uint64 { return device.fq.drops.Load() }

// enqueue queues peer's batch (locked, nonces and keypair set) and runs
// the scheduler.
func (device *Device) fqEnqueue(peer *Peer, c *QueueOutboundElementsContainer) {
	fq := &device.fq
	fq.mu.Lock()
	defer fq.mu.Unlock()
	st := &peer.fq
	if st.packets+len(c.elems) > fqPeerLimit {
		fq.drops.Add(uint64(len(c.elems)))
		device.fqFree(c)
	} else {
		c.fqEnqueued = fq.now()
		st.batches = append(st.batches, c)
		st.packets += len(c.elems)
		if !st.active {
			st.active = true
			st.deficit = 0
			fq.active = append(fq.active, peer)
		}
	}
	device.fqPumpLocked()
}

// fqRelease returns a sent (or discarded) batch's packets to the budget
// and runs the scheduler.
func (device *Device) fqRelease(packets int) {
	fq := &device.fq
	fq.mu.Lock()
	defer fq.mu.Unlock()
	fq.inflightPackets -= packets
	fq.inflightBatches--
	device.fqPumpLocked()
}

// fqForget drops a stopping peer's queue.
func (device *Device) fqForget(peer *Peer) {
	fq := &device.fq
	fq.mu.Lock()
	defer fq.mu.Unlock()
	device.fqDeactivateLocked(peer)
}

func (device *Device) fqDeactivateLocked(peer *Peer) {
	fq := &device.fq
	st := &peer.fq
	for _, c := range st.batches {
		device.fqFree(c)
	}
	clear(st.batches)
	st.batches = st.batches[:0]
	st.packets, st.deficit, st.active = 0, 0, false
	st.codel.idle()
	for i, p := range fq.active {
		if p == peer {
			n := copy(fq.active[i:], fq.active[i+1:])
			fq.active[i+n] = nil
			fq.active = fq.active[:i+n]
			break
		}
	}
}

// fqPumpLocked hands batches to the workers while the budget allows, in
// deficit round robin between the active peers.
func (device *Device) fqPumpLocked() {
	fq := &device.fq
	for fq.inflightPackets < fqInflightPackets && fq.inflightBatches < fqInflightBatches && len(fq.active) > 0 {
		peer := fq.active[0]
		st := &peer.fq
		if !peer.isRunning.Load() {
			device.fqDeactivateLocked(peer)
			continue
		}
		if st.deficit <= 0 {
			st.deficit += fqQuantum
			copy(fq.active, fq.active[1:])
			fq.active[len(fq.active)-1] = peer
			continue
		}
		c := device.fqDequeueLocked(st)
		if st.packets == 0 {
			device.fqDeactivateLocked(peer)
		}
		if c == nil {
			continue
		}
		for _, elem := range c.elems {
			st.deficit -= len(elem.packet)
		}
		c.fqPackets = len(c.elems)
		fq.inflightPackets += c.fqPackets
		fq.inflightBatches++
		peer.queueOutbound(c)
		device.queue.encryption.c <- c
	}
}

// fqDequeueLocked takes up to fqUnit packets from the head of st, drops
// those CoDel says to, and returns the rest as one locked batch, or nil if
// all were dropped.
func (device *Device) fqDequeueLocked(st *fqPeer) *QueueOutboundElementsContainer {
	fq := &device.fq
	head := st.batches[0]
	now := fq.now()
	sojourn := now - head.fqEnqueued
	out := head
	if len(head.elems) > fqUnit {
		out = device.GetOutboundElementsContainer()
		out.Lock()
	}
	kept := 0
	n := min(len(head.elems), fqUnit)
	for i := 0; i < n; i++ {
		elem := head.elems[i]
		st.packets--
		if st.codel.shouldDrop(now, sojourn, st.packets, fq.target, fq.interval) {
			fq.drops.Add(1)
			device.PutMessageBuffer(elem.buffer)
			device.PutOutboundElement(elem)
			continue
		}
		if out == head {
			head.elems[kept] = elem
		} else {
			out.elems = append(out.elems, elem)
		}
		kept++
	}
	if out == head {
		clear(head.elems[kept:])
		head.elems = head.elems[:kept]
		copy(st.batches, st.batches[1:])
		st.batches[len(st.batches)-1] = nil
		st.batches = st.batches[:len(st.batches)-1]
	} else {
		rest := copy(head.elems, head.elems[n:])
		clear(head.elems[rest:])
		head.elems = head.elems[:rest]
	}
	if st.packets == 0 {
		st.codel.idle()
	}
	if kept == 0 {
		device.PutOutboundElementsContainer(out)
		return nil
	}
	return out
}

// fqFree returns a queued batch and its packets to the pools.
func (device *Device) fqFree(c *QueueOutboundElementsContainer) {
	for _, elem := range c.elems {
		device.PutMessageBuffer(elem.buffer)
		device.PutOutboundElement(elem)
	}
	device.PutOutboundElementsContainer(c)
}
