// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
)

// BenchmarkInProcessTCP measures the whole user-mode data path in one
// process: the job's user-space stack and WireGuard client (encrypt) →
// loopback UDP → the gateway's WireGuard device (decrypt) → its netstack →
// a host TCP socket to a local sink ("up"), and a local source → the
// gateway → the job ("down"). Each op moves chunk bytes; MB/s is the
// throughput. The job's stack runs in the same process, so the figure is a
// regression indicator, not a link speed.
func BenchmarkInProcessTCP(b *testing.B) {
	const chunk = 64 << 10
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	// Port 9 discards; port 19 sends until the job closes.
	go func() {
		buf := make([]byte, chunk)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var mode [1]byte
				if _, err := io.ReadFull(c, mode[:]); err != nil {
					return
				}
				if mode[0] == 'u' {
					io.Copy(io.Discard, c)
					return
				}
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	g := startGateway(b, remote{job: "198.51.100.7:80", real: ln.Addr().String()})
	j := joinJob(b, g, newToken(b, g))
	// The test gateway's leases live 600 ms; keep this one alive.
	renewCtx, stopRenew := context.WithCancel(context.Background())
	defer stopRenew()
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-t.C:
				j.cc.Renew(renewCtx, control.LeaseRef{ID: j.lease.ID, Secret: j.lease.Secret})
			}
		}
	}()

	for _, dir := range []string{"up", "down"} {
		b.Run(dir, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c, err := j.net.DialContext(ctx, "tcp", "198.51.100.7:80")
			if err != nil {
				b.Fatalf("dial through tunnel: %v", err)
			}
			defer c.Close()
			if _, err := c.Write([]byte{dir[0]}); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, chunk)
			b.SetBytes(chunk)
			b.ResetTimer()
			for range b.N {
				if dir == "up" {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				} else if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
		})
	}
}
