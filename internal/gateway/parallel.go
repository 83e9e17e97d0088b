// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"runtime"

	"github.com/airlock-vpn/airlock/internal/mqtun"
)

// The gateway's data path in parallel: jobs' WireGuard datagrams arrive on
// Config.UDPSockets sockets per address family sharing the port
// (SO_REUSEPORT, tunnel.NewReusePortBind; the kernel keeps each job on one
// socket), each read by a goroutine of its own; decryption and encryption
// run on wireguard-go's per-CPU workers; the egress backend's TUN has
// Config.TUNQueues queues (IFF_MULTI_QUEUE, internal/mqtun), each read by a
// goroutine of its own, and each job's packets are written to one queue
// chosen by its address. No lock on this path is shared by all jobs.
// docs/architecture.md, "The gateway on many cores", says how to size it.

// MaxParallel bounds Config.UDPSockets and Config.TUNQueues.
const MaxParallel = mqtun.MaxQueues

// setParallel gives UDPSockets and TUNQueues their defaults (GOMAXPROCS)
// and checks them.
func (c *Config) setParallel() error {
	def := min(runtime.GOMAXPROCS(0), MaxParallel)
	for _, v := range []struct {
		flag string
		n    *int
	}{{"--udp-sockets", &c.UDPSockets}, {"--tun-queues", &c.TUNQueues}} {
		if *v.n == 0 {
			*v.n = def
		}
		if *v.n < 1 || *v.n > MaxParallel {
			return fmt.Errorf("gateway: %s %d out of range 1-%d (0: one per core the gateway may use, GOMAXPROCS)", v.flag, *v.n, MaxParallel)
		}
	}
	return nil
}
