// SPDX-License-Identifier: MIT

package loadgen

import (
	"os"
	"sync"

	"golang.zx2c4.com/wireguard/tun"
)

// chanTUN is a tun.Device whose "operating system" side is two channels:
// the job writes IP packets to out (the device reads and encrypts them)
// and reads what the device decrypted from in. Writes never block the
// device: packets nobody waits for are dropped when in is full. It is safe
// for concurrent use.
type chanTUN struct {
	mtu    int
	out    chan []byte
	in     chan []byte
	events chan tun.Event

	closeOnce sync.Once
	closed    chan struct{}
}

func newChanTUN(mtu int) *chanTUN {
	if mtu <= 0 {
		mtu = 1420
	}
	t := &chanTUN{mtu: mtu, out: make(chan []byte), in: make(chan []byte, 4),
		events: make(chan tun.Event, 1), closed: make(chan struct{})}
	t.events <- tun.EventUp
	return t
}

func (t *chanTUN) File() *os.File { return nil }

func (t *chanTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	select {
	case <-t.closed:
		return 0, os.ErrClosed
	case p := <-t.out:
		sizes[0] = copy(bufs[0][offset:], p)
		return 1, nil
	}
}

func (t *chanTUN) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		p := append([]byte(nil), b[offset:]...)
		select {
		case t.in <- p:
		case <-t.closed:
			return 0, os.ErrClosed
		default: // nobody is waiting: drop
		}
	}
	return len(bufs), nil
}

func (t *chanTUN) MTU() (int, error)        { return t.mtu, nil }
func (t *chanTUN) Name() (string, error)    { return "loadgen", nil }
func (t *chanTUN) Events() <-chan tun.Event { return t.events }
func (t *chanTUN) BatchSize() int           { return 1 }

func (t *chanTUN) Close() error {
	t.closeOnce.Do(func() {
		close(t.closed)
		close(t.events)
	})
	return nil
}
