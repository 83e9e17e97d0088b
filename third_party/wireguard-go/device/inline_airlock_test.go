// SPDX-License-Identifier: MIT

package device

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"
)

// TestRunToCompletion runs two devices with the run-to-completion path
// (inline.go) on one end or both, over real sockets: pings both ways
// (the handshake's staged packet too), then bursts whose packets must all
// arrive intact.
func TestRunToCompletion(t *testing.T) {
	for _, tt := range []struct {
		name   string
		inline [2]bool
	}{{"both", [2]bool{true, true}}, {"client only", [2]bool{false, true}}} {
		t.Run(tt.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			pair := genTestPair(t, true)
			for i := range pair {
				pair[i].dev.SetRunToCompletion(tt.inline[i])
			}
			pair.Send(t, Ping, nil)
			pair.Send(t, Pong, nil)
			for _, dir := range []SendDirection{Ping, Pong} {
				from, to := pair[1], pair[0]
				if !dir {
					from, to = to, from
				}
				const n = 300
				want := make(map[uint32][]byte, n)
				go func() {
					for i := range n {
						msg := tuntest.Ping(to.ip, from.ip)
						// A distinct ICMP payload per packet.
						msg = binary.BigEndian.AppendUint32(msg, uint32(i))
						msg[3] = byte(len(msg)) // IPv4 total length (small packets)
						from.tun.Outbound <- msg
					}
				}()
				for i := range n {
					msg := tuntest.Ping(to.ip, from.ip)
					msg = binary.BigEndian.AppendUint32(msg, uint32(i))
					msg[3] = byte(len(msg))
					want[uint32(i)] = msg
				}
				timeout := time.After(10 * time.Second)
				for range n {
					select {
					case got := <-to.tun.Inbound:
						k := binary.BigEndian.Uint32(got[len(got)-4:])
						if !bytes.Equal(got, want[k]) {
							t.Fatalf("%s: packet %d arrived as %x, want %x", dir, k, got, want[k])
						}
						delete(want, k)
					case <-timeout:
						t.Fatalf("%s: %d of %d packets did not arrive", dir, len(want), n)
					}
				}
			}
		})
	}
}
