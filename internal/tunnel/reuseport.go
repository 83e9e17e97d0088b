// SPDX-License-Identifier: MIT

package tunnel

import (
	"errors"
	"fmt"
	"hash/maphash"

	"golang.zx2c4.com/wireguard/conn"

	// wireguard-go's conn package with SO_REUSEPORT binds
	// (third_party/wireguard-go/README.md).
	wgconn "github.com/airlock-vpn/airlock/third_party/wireguard-go/conn"
)

// ReusePort theory of operation: one UDP socket per address family reads
// every job's datagrams in one goroutine, through one receive queue, and
// every send of every job goes through it. NewReusePortBind opens n
// wireguard-go StdNetBinds (each one socket per family, with UDP GSO/GRO and
// batched I/O as before) on the same port with SO_REUSEPORT. The kernel
// spreads arriving datagrams over the n sockets by a hash of their
// addresses and ports, so a job's datagrams always arrive on one socket;
// wireguard-go reads each socket in a goroutine of its own (a ReceiveFunc
// each). Sends pick a socket by a hash of the peer's endpoint, so a job's
// sends also take one socket and the binds share no lock. Only sockets of
// the same user may join a SO_REUSEPORT group, so no other user on the
// host can bind the port and take a share of the jobs' datagrams.

// MaxUDPSockets bounds NewReusePortBind's n.
const MaxUDPSockets = 64

// reusePortBind is n StdNetBinds on one port; see the theory of operation.
type reusePortBind struct {
	binds []conn.Bind
	seed  maphash.Seed
}

// NewReusePortBind returns a conn.Bind of n UDP sockets per address family
// sharing one port (SO_REUSEPORT). n = 1 is wireguard-go's StdNetBind
// itself.
func NewReusePortBind(n int) (conn.Bind, error) {
	if n < 1 || n > MaxUDPSockets {
		return nil, fmt.Errorf("udp sockets: %d, want 1-%d", n, MaxUDPSockets)
	}
	if n == 1 {
		return conn.NewStdNetBind(), nil
	}
	b := &reusePortBind{seed: maphash.MakeSeed()}
	for i := 0; i < n; i++ {
		b.binds = append(b.binds, wgconn.NewStdNetBindReusePort())
	}
	return b, nil
}

// Open opens the first bind on port and the others on the port it got, and
// returns every bind's receive functions.
func (b *reusePortBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	var fns []conn.ReceiveFunc
	for i, bb := range b.binds {
		f, actual, err := bb.Open(port)
		if err != nil {
			for _, o := range b.binds[:i] {
				o.Close()
			}
			return nil, 0, fmt.Errorf("udp socket %d of %d on port %d: %w", i+1, len(b.binds), port, err)
		}
		port = actual
		fns = append(fns, f...)
	}
	return fns, port, nil
}

// Close closes every bind.
func (b *reusePortBind) Close() error {
	var errs []error
	for _, bb := range b.binds {
		errs = append(errs, bb.Close())
	}
	return errors.Join(errs...)
}

// SetMark sets the mark on every socket.
func (b *reusePortBind) SetMark(mark uint32) error {
	for _, bb := range b.binds {
		if err := bb.SetMark(mark); err != nil {
			return err
		}
	}
	return nil
}

// Send sends bufs to ep from the socket of ep's hash.
func (b *reusePortBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	return b.binds[b.pick(ep)].Send(bufs, ep)
}

// pick returns the index of ep's bind.
func (b *reusePortBind) pick(ep conn.Endpoint) int {
	e, ok := ep.(*wgconn.StdNetEndpoint)
	if !ok {
		return 0 // the bind refuses it
	}
	return int(maphash.Comparable(b.seed, e.AddrPort) % uint64(len(b.binds)))
}

// ParseEndpoint parses a UDP endpoint.
func (b *reusePortBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	return b.binds[0].ParseEndpoint(s)
}

// BatchSize is the binds' batch size.
func (b *reusePortBind) BatchSize() int { return b.binds[0].BatchSize() }
