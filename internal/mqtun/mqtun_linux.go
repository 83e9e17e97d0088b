// SPDX-License-Identifier: MIT

// Package mqtun is a multi-queue TUN (IFF_MULTI_QUEUE) as one wireguard-go
// tun.Device, so that a gateway's WireGuard device reads and writes its
// jobs' packets on several queues at once instead of one.
//
// # Theory of operation
//
// A TUN created with IFF_MULTI_QUEUE has one file descriptor per queue;
// each descriptor is a wireguard-go NativeTun of its own (with its own
// read and write locks, GRO tables and TSO splitting), so nothing is shared
// between queues in user space.
//
// Reads: the WireGuard device reads the Device from several goroutines at
// once (device.NewDeviceReaders, one per queue). Each Read claims a queue
// no other Read holds (a bit in an atomic mask, no lock) and reads it; with
// as many readers as queues every queue always has its reader. The kernel
// sends a flow's packets to the queue its packets were last written on
// (the TUN's flow table, "automq"), else by the flow's hash.
//
// Writes: a Write carries one peer's packets (wireguard-go writes each
// peer's batch on its own), whose source is the job's address; the queue is
// chosen by a hash of the first packet's source address, so a job's
// packets always take one queue (their order and GRO kept) and jobs on
// different queues take no lock in common. The kernel then answers each
// job's flows on the queue its packets came from.
package mqtun

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"
)

// MaxQueues bounds the queues of a Device (the kernel allows 256 per TUN;
// one per core is what helps).
const MaxQueues = 64

// Device is a multi-queue TUN. It is safe for concurrent use; Read may be
// called by up to len(queues) goroutines at once without two of them
// sharing a queue. Create it with Open or FromFDs.
type Device struct {
	queues []*queue
	name   string
	// busy has bit i set while a Read holds queue i.
	busy atomic.Uint64
	// next picks a queue when every queue is held (more readers than
	// queues): that Read then waits behind the holder.
	next atomic.Uint32
	// wake is set by Wake until a Read returns for it.
	wake atomic.Bool
	seed maphash.Seed
}

// queue is one queue's NativeTun.
type queue struct {
	dev  tun.Device
	file *os.File
	// blocked is set while a Read waits on this queue (Wake).
	blocked atomic.Bool
}

// FromFDs makes a Device of fds, the queues of one TUN (each opened with
// IFF_MULTI_QUEUE, or a single TUN's one descriptor), IFF_NO_PI and
// IFF_VNET_HDR for offloads. The Device owns the descriptors from then on,
// also on error.
func FromFDs(fds []int) (*Device, error) {
	if len(fds) == 0 || len(fds) > MaxQueues {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("multi-queue tun: %d queues, want 1-%d", len(fds), MaxQueues)
	}
	d := &Device{seed: maphash.MakeSeed()}
	for i, fd := range fds {
		dev, name, err := tun.CreateUnmonitoredTUNFromFD(fd)
		if err != nil {
			unix.Close(fd)
			for _, fd := range fds[i+1:] {
				unix.Close(fd)
			}
			d.Close()
			return nil, fmt.Errorf("multi-queue tun: queue %d: %w", i, err)
		}
		if i == 0 {
			d.name = name
		}
		d.queues = append(d.queues, &queue{dev: dev, file: dev.File()})
	}
	return d, nil
}

// OpenQueues creates the TUN name (or attaches to it if it exists as a
// multi-queue TUN of this user) with n queues, IFF_TUN|IFF_NO_PI|
// IFF_VNET_HDR|IFF_MULTI_QUEUE, and returns their descriptors (close-on-
// exec, blocking; FromFDs makes them non-blocking). With n = 1 the TUN is
// made without IFF_MULTI_QUEUE, as before queues existed.
func OpenQueues(name string, n int) ([]int, error) {
	if n < 1 || n > MaxQueues {
		return nil, fmt.Errorf("create tun %q: %d queues, want 1-%d", name, n, MaxQueues)
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if n > 1 {
		flags |= unix.IFF_MULTI_QUEUE
	}
	var fds []int
	for i := 0; i < n; i++ {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			err = setIff(fd, name, flags)
			if err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			if i == 0 {
				return nil, fmt.Errorf("create tun %q: %w", name, err)
			}
			return nil, fmt.Errorf("create tun %q: queue %d of %d: %w", name, i+1, n, err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

func setIff(fd int, name string, flags uint16) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(flags)
	return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
}

// Queues returns how many queues d has: the number of readers to run.
func (d *Device) Queues() int { return len(d.queues) }

// File returns the first queue's file (tun.Device); the others' are
// reachable through their queues only.
func (d *Device) File() *os.File { return d.queues[0].file }

// Name returns the TUN's name.
func (d *Device) Name() (string, error) { return d.name, nil }

// MTU returns the TUN's MTU, looked up by name in the caller's network
// namespace.
func (d *Device) MTU() (int, error) { return d.queues[0].dev.MTU() }

// Events returns the first queue's events (one EventUp).
func (d *Device) Events() <-chan tun.Event { return d.queues[0].dev.Events() }

// BatchSize returns the queues' batch size.
func (d *Device) BatchSize() int { return d.queues[0].dev.BatchSize() }

// Read reads packets from a queue no other Read holds, as tun.Device's
// Read: into bufs[i][offset:], lengths into sizes. A Wake before or while
// it waits makes one Read return 0 and os.ErrDeadlineExceeded.
func (d *Device) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	i, held := d.claim()
	q := d.queues[i]
	q.blocked.Store(true)
	// Wake stores wake before it looks for a blocked queue: either this
	// sees its wake, or it sees this queue blocked.
	if d.wake.Swap(false) {
		q.blocked.Store(false)
		if held {
			d.release(i)
		}
		return 0, os.ErrDeadlineExceeded
	}
	n, err := q.dev.Read(bufs, sizes, offset)
	q.blocked.Store(false)
	if held {
		d.release(i)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		q.file.SetReadDeadline(time.Time{})
		d.wake.Store(false)
	}
	return n, err
}

// claim returns a queue that no Read holds, marked held (held true); when
// all are held, one round-robin, not marked.
func (d *Device) claim() (i int, held bool) {
	all := uint64(1)<<len(d.queues) - 1
	for {
		b := d.busy.Load()
		free := ^b & all
		if free == 0 {
			return int(d.next.Add(1) % uint32(len(d.queues))), false
		}
		i := bits.TrailingZeros64(free)
		if d.busy.CompareAndSwap(b, b|1<<i) {
			return i, true
		}
	}
}

// release gives queue i back.
func (d *Device) release(i int) {
	for {
		b := d.busy.Load()
		if d.busy.CompareAndSwap(b, b&^(1<<i)) {
			return
		}
	}
}

// Wake makes one Read that waits on an empty queue, or the next Read to
// start, return at once (with os.ErrDeadlineExceeded), so that its caller
// can serve packets from elsewhere (a caller checks its other source, then
// reads: a Wake between the two is not lost).
func (d *Device) Wake() {
	d.wake.Store(true)
	for _, q := range d.queues {
		if q.blocked.Load() {
			q.file.SetReadDeadline(time.Unix(1, 0))
			return
		}
	}
}

// Write writes bufs[i][offset:], IP packets, to the queue of the first
// packet's source address (see the package comment).
func (d *Device) Write(bufs [][]byte, offset int) (int, error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	return d.queues[d.queueOf(bufs[0], offset)].dev.Write(bufs, offset)
}

// queueOf hashes the source address of the IP packet p[offset:].
func (d *Device) queueOf(p []byte, offset int) int {
	if len(d.queues) == 1 || offset >= len(p) {
		return 0
	}
	pkt := p[offset:]
	var src []byte
	switch pkt[0] >> 4 {
	case 4:
		if len(pkt) >= 20 {
			src = pkt[12:16]
		}
	case 6:
		if len(pkt) >= 40 {
			src = pkt[8:24]
		}
	}
	if src == nil {
		return 0
	}
	return int(maphash.Bytes(d.seed, src) % uint64(len(d.queues)))
}

// Close closes every queue; the TUN goes with the last descriptor.
func (d *Device) Close() error {
	var errs []error
	for _, q := range d.queues {
		errs = append(errs, q.dev.Close())
	}
	return errors.Join(errs...)
}

var _ tun.Device = (*Device)(nil)
