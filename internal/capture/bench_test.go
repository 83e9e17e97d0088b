// SPDX-License-Identifier: MIT

package capture

import (
	"context"
	"io"
	"testing"
)

// BenchmarkWrite measures Device.Write of a 32-packet batch of 1420-byte
// packets (a WireGuard batch), per packet: with no capture, with one
// capturing everything into a reader that keeps up (io.Discard), and with
// one whose reader is stalled (every packet dropped).
func BenchmarkWrite(b *testing.B) {
	pkt := ipv4("100.64.0.2", "192.0.2.10", protoTCP, 40000, 80, 1380)
	bufs := make([][]byte, 32)
	for i := range bufs {
		bufs[i] = pkt
	}
	for _, mode := range []string{"none", "capture", "stalled"} {
		b.Run(mode, func(b *testing.B) {
			dev := NewDevice(&nopTUN{}, nil)
			if mode != "none" {
				tap := dev.NewTap(TapConfig{Name: mode})
				dev.Attach(tap)
				defer dev.Detach(tap)
				if mode == "capture" {
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan struct{})
					go func() { defer close(done); tap.Serve(ctx, io.Discard, nil) }()
					defer func() { cancel(); <-done }()
				}
			}
			b.SetBytes(int64(len(pkt)))
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n += len(bufs) {
				dev.Write(bufs, 0)
			}
		})
	}
}
