// SPDX-License-Identifier: MIT

package device

import (
	"sync"
	"sync/atomic"
)

// Airlock's patch: run to completion for a device with one peer.
//
// Upstream hands every batch from the goroutine that read it (the TUN
// reader, a socket's receiver) to the per-CPU encryption or decryption
// workers and, for ordering, to the peer's sequential sender or receiver:
// four goroutines and two channel operations per batch and direction,
// built for a server with many peers on many cores. A job's client has
// one peer, and every hand-off costs it scheduler work and cache misses
// that the job beside it pays for. With SetRunToCompletion the goroutine
// that read a batch also encrypts and sends it (sendInline) or decrypts
// it and writes it to the TUN (receiveInline), still a batch at a time:
// at most one goroutine per direction and socket is busy, so the client
// takes no more cores than its traffic needs. The workers and the peer's
// routines still run and serve a device with the mode off.
//
// Ordering: one TUN reader stages a peer's packets, and sendInline holds
// the peer's send lock while it encrypts and sends, so batches leave in
// order of their nonces except when a keepalive or a handshake's flush
// races the reader (a few packets, well inside the receiver's replay
// window). Receive paths (one per socket and the stream transport) take
// the peer's receive lock, which also guards the replay filter that
// upstream touches from the sequential receiver alone.

// inlineState is a device's run-to-completion switch.
type inlineState = atomic.Bool

// SetRunToCompletion turns the run-to-completion data path on or off (see
// above). It is meant for a device with one peer (Airlock's client); a
// device with many peers keeps upstream's parallel workers.
func (device *Device) SetRunToCompletion(on bool) { device.inline.Store(on) }

// peerInline is a peer's state for the run-to-completion path.
type peerInline struct {
	sendMu   sync.Mutex
	sendBufs [][]byte // guarded by sendMu: sendContainer's scratch

	recvMu   sync.Mutex
	recvBufs [][]byte // guarded by recvMu: receiveContainer's scratch
}

// sendInline encrypts and sends elemsContainer (locked, with nonces and
// keypair set, as SendStagedPackets queues it) in the caller's goroutine.
func (peer *Peer) sendInline(elemsContainer *QueueOutboundElementsContainer) {
	peer.inline.sendMu.Lock()
	defer peer.inline.sendMu.Unlock()
	peer.device.encryptElems(elemsContainer)
	peer.sendContainer(elemsContainer, &peer.inline.sendBufs)
}

// receiveInline decrypts elemsContainer (locked, as RoutineReceiveIncoming
// queues it) and writes its packets to the TUN in the caller's goroutine.
func (peer *Peer) receiveInline(elemsContainer *QueueInboundElementsContainer) {
	peer.inline.recvMu.Lock()
	defer peer.inline.recvMu.Unlock()
	decryptElems(elemsContainer)
	peer.receiveContainer(elemsContainer, &peer.inline.recvBufs)
}
