/* SPDX-License-Identifier: MIT
 *
 * Airlock's patch: the test of awaitsResponse (receive.go).
 */

package device

import (
	"crypto/rand"
	"encoding/binary"
	"testing"
	"time"
)

// TestUnderLoadOwnInitiation: a device under load that initiates a
// handshake completes it with the peer's first response, without the
// cookie round that would hold it until the initiation's retry (5 s).
func TestUnderLoadOwnInitiation(t *testing.T) {
	pair := genTestPair(t, false)
	gw, job := pair[0].dev, pair[1].dev
	gw.rate.underLoadUntil.Store(time.Now().Add(time.Hour).UnixNano())
	if !gw.IsUnderLoad() {
		t.Fatal("device not under load")
	}
	peer := gw.LookupPeer(job.staticIdentity.publicKey)
	if peer == nil {
		t.Fatal("no peer for the other device")
	}
	if err := peer.SendHandshakeInitiation(false); err != nil {
		t.Fatalf("send initiation: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for peer.lastHandshakeNano.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no handshake within 2 s of the initiation under load: the response went through a cookie round")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAwaitsResponse: only a response-sized packet whose receiver index
// names a handshake waiting for its response passes; anything else keeps
// the cookie round and the per-source limit.
func TestAwaitsResponse(t *testing.T) {
	pair := genTestPair(t, false)
	dev := pair[0].dev
	peer := dev.LookupPeer(pair[1].dev.staticIdentity.publicKey)
	init, err := dev.CreateMessageInitiation(peer)
	if err != nil {
		t.Fatalf("create initiation: %v", err)
	}
	resp := make([]byte, MessageResponseSize)
	binary.LittleEndian.PutUint32(resp, MessageResponseType)
	binary.LittleEndian.PutUint32(resp[8:], init.Sender)
	if !dev.awaitsResponse(resp) {
		t.Error("a response to the pending initiation is not recognised")
	}
	if dev.awaitsResponse(resp[:MessageResponseSize-1]) {
		t.Error("a short packet passes")
	}
	other := make([]byte, MessageResponseSize)
	rand.Read(other)
	binary.LittleEndian.PutUint32(other[8:], init.Sender+1)
	if dev.awaitsResponse(other) {
		t.Error("a response with another receiver index passes")
	}
	// Once the handshake has moved on (here: the peer's own initiation
	// consumed, state reset), its index no longer passes.
	peer.handshake.mutex.Lock()
	peer.handshake.state = handshakeZeroed
	peer.handshake.mutex.Unlock()
	if dev.awaitsResponse(resp) {
		t.Error("a response to a handshake that no longer waits passes")
	}
}
