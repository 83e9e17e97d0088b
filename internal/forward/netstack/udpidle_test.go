// SPDX-License-Identifier: MIT

package netstack

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestUDPIdleFlowHoldsNoBuffer: a UDP pump that relayed a datagram and
// waits for the next holds no relay buffer (64 KiB each, two per flow)
// when it can wait for its socket to become readable, relays the next
// datagram, and ends at its idle timeout; without the wait (ready nil,
// as every flow did before) it holds one for its whole life.
func TestUDPIdleFlowHoldsNoBuffer(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ready bool
		held  int64
	}{{"waits for readable", true, 0}, {"reads at once", false, 1}} {
		t.Run(tt.name, func(t *testing.T) {
			// peer → src (the pump's source), dst → sink.
			src, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			peer, err := net.DialUDP("udp", nil, src.LocalAddr().(*net.UDPAddr))
			if err != nil {
				t.Fatal(err)
			}
			defer peer.Close()
			sink, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			defer sink.Close()
			dst, err := net.DialUDP("udp", nil, sink.LocalAddr().(*net.UDPAddr))
			if err != nil {
				t.Fatal(err)
			}
			f := &connPair{a: src, b: dst}
			defer f.Close()
			var ready readyFunc
			if tt.ready {
				ready = socketReadable(src)
			}
			var last atomic.Int64
			last.Store(time.Now().UnixNano())
			var dropped atomic.Uint64
			done := make(chan int64, 1)
			const idle = 1500 * time.Millisecond
			held0 := udpBufsHeld.Load()
			go func() {
				done <- pumpUDP(dst, src, ready, &last, idle, f, nil, &dropped, func(uint64, uint64) {})
			}()
			buf := make([]byte, 100)
			for i, msg := range []string{"first", "second"} {
				if _, err := peer.Write([]byte(msg)); err != nil {
					t.Fatal(err)
				}
				sink.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, err := sink.Read(buf)
				if err != nil || !bytes.Equal(buf[:n], []byte(msg)) {
					t.Fatalf("datagram %d: got %q, %v; want %q", i, buf[:n], err, msg)
				}
				topology.Poll(2*time.Second, func() bool { return udpBufsHeld.Load()-held0 == tt.held })
				if got := udpBufsHeld.Load() - held0; got != tt.held {
					t.Errorf("after datagram %d, idle: the pump holds %d relay buffers, want %d", i, got, tt.held)
				}
			}
			select {
			case n := <-done:
				if n != int64(len("first")+len("second")) {
					t.Errorf("relayed %d bytes, want %d", n, len("first")+len("second"))
				}
			case <-time.After(idle + 5*time.Second):
				t.Fatalf("the pump did not end %v after its idle timeout", 5*time.Second)
			}
			if got := udpBufsHeld.Load() - held0; got != 0 {
				t.Errorf("after the pump ended: %d relay buffers held, want 0", got)
			}
		})
	}
}
