// SPDX-License-Identifier: MIT

package impair

// Theory of operation: a Relay bridges two interfaces at layer 2. It opens
// one AF_PACKET socket per interface, bound to it, promiscuous, with
// PACKET_IGNORE_OUTGOING so that a socket never reads the frames the relay
// itself sends on its interface. One goroutine per direction (pump) reads
// frames from one socket in batches (recvmmsg), asks the direction's Shaper
// for a verdict, keeps each accepted frame in a preallocated slot until its
// release time (Queue) and writes due frames in batches (sendmmsg) to the
// other socket. Between batches it sleeps in ppoll until a frame arrives or
// the next frame is due (frames due within releaseSlack leave together, so
// delays are exact to within 50 µs early). The data path allocates nothing
// per frame.
//
// Frames are relayed one wire packet at a time: the interfaces that feed the
// relay must not hand it GSO super-frames (see DisableOffloads); a frame
// larger than a slot is dropped and counted.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// slotSize is the largest frame the relay carries (Ethernet frame of
	// a 1500-byte MTU with room to spare).
	slotSize = 2048
	// batch is the most frames one recvmmsg or sendmmsg call moves.
	batch = 64
	// idleWait bounds a pump's sleep, so that it notices cancellation.
	idleWait = 100 * time.Millisecond
	// releaseSlack is how early a frame may leave: frames due within it
	// go out in the same batch, so that a pump wakes up at most about
	// once per releaseSlack instead of once per frame.
	releaseSlack = 50 * time.Microsecond
	// sockBuf is the socket buffer size asked for (SO_RCVBUFFORCE).
	sockBuf = 16 << 20
	// DefaultSlots is the number of frames a direction can hold (in its
	// delay and rate queues) when Relay.Slots is 0: 20 MiB of 2 KiB slots,
	// enough for 1 Gbit/s with 100 ms of one-way delay.
	DefaultSlots = 10240
)

// Relay forwards frames between interfaces A and B of the current network
// namespace, impaired by Config: Config.Up applies to frames that arrive on
// A (and leave on B), Config.Down to frames from B to A.
type Relay struct {
	A, B   string // interface names
	Config Config
	// Slots is the number of frames each direction can hold; 0 means
	// DefaultSlots. Frames beyond it are dropped and counted.
	Slots int
	// Logger receives start-up and periodic statistics. Required.
	Logger *slog.Logger
	// Ready, if non-nil, is called once both sockets are bound.
	Ready func()
}

// RelayStats are a direction's counters.
type RelayStats struct {
	Stats
	Sent      uint64 // frames written
	Oversize  uint64 // frames larger than a slot, dropped
	NoSlot    uint64 // frames dropped because every slot was in use
	SendError uint64 // frames the kernel refused
}

// Run relays until ctx is done or a socket fails. It returns nil after
// cancellation.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.Config.Validate(); err != nil {
		return fmt.Errorf("impairment: %w", err)
	}
	fa, err := openPacket(r.A)
	if err != nil {
		return err
	}
	defer unix.Close(fa)
	fb, err := openPacket(r.B)
	if err != nil {
		return err
	}
	defer unix.Close(fb)
	if r.Ready != nil {
		r.Ready()
	}
	slots := r.Slots
	if slots <= 0 {
		slots = DefaultSlots
	}
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, p := range []*pump{
		newPump(r.A+"→"+r.B, fa, fb, NewShaper(r.Config.Up, r.Config.Seed, 1), slots, start, r.Logger),
		newPump(r.B+"→"+r.A, fb, fa, NewShaper(r.Config.Down, r.Config.Seed, 2), slots, start, r.Logger),
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = p.run(ctx); errs[i] != nil {
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// openPacket returns an AF_PACKET socket bound to ifname that sees every
// frame arriving there (promiscuous) except those sent through it.
func openPacket(ifname string) (int, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return -1, fmt.Errorf("packet socket on %s: %w", ifname, err)
	}
	// Protocol 0 until bound, so that no frame of another interface
	// slips in before bind.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open packet socket on %s: %w", ifname, err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("packet socket on %s: %s: %w", ifname, what, err)
	}
	for _, o := range []struct {
		level, opt, v int
		name          string
	}{
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING"},
		{unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1, "PACKET_QDISC_BYPASS"},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBuf, "SO_RCVBUFFORCE"},
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBuf, "SO_SNDBUFFORCE"},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			return fail(o.name, err)
		}
	}
	mreq := unix.PacketMreq{Ifindex: int32(ifi.Index), Type: unix.PACKET_MR_PROMISC}
	if err := unix.SetsockoptPacketMreq(fd, unix.SOL_PACKET, unix.PACKET_ADD_MEMBERSHIP, &mreq); err != nil {
		return fail("promiscuous", err)
	}
	all := htons(unix.ETH_P_ALL)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: all, Ifindex: ifi.Index}); err != nil {
		return fail("bind", err)
	}
	return fd, nil
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// mmsghdr is struct mmsghdr of recvmmsg(2) and sendmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// pump is one direction of a Relay. Only its run goroutine touches it.
type pump struct {
	name     string
	rx, tx   int
	shaper   *Shaper
	start    time.Time
	log      *slog.Logger
	slab     []byte
	lens     []int32
	free     []int32
	q        Queue[int32]
	rxSlots  [batch]int32 // slots lent to the next recvmmsg (-1: none)
	rxMsgs   [batch]mmsghdr
	rxIov    [batch]unix.Iovec
	txSlots  [batch]int32
	txMsgs   [batch]mmsghdr
	txIov    [batch]unix.Iovec
	stats    RelayStats
	reported RelayStats
}

func newPump(name string, rx, tx int, s *Shaper, slots int, start time.Time, log *slog.Logger) *pump {
	p := &pump{name: name, rx: rx, tx: tx, shaper: s, start: start, log: log,
		slab: make([]byte, slots*slotSize), lens: make([]int32, slots), free: make([]int32, 0, slots)}
	for i := slots - 1; i >= 0; i-- {
		p.free = append(p.free, int32(i))
	}
	for i := range p.rxSlots {
		p.rxSlots[i] = -1
	}
	return p
}

func (p *pump) now() time.Duration { return time.Since(p.start) }

func (p *pump) slot(i int32) []byte { return p.slab[int(i)*slotSize : int(i+1)*slotSize] }

func (p *pump) run(ctx context.Context) error {
	fds := []unix.PollFd{{Fd: int32(p.rx), Events: unix.POLLIN}}
	lastReport := time.Now()
	for ctx.Err() == nil {
		if err := p.flush(p.now() + releaseSlack); err != nil {
			return err
		}
		wait := idleWait
		if at, ok := p.q.Next(); ok {
			wait = min(wait, max(at-releaseSlack-p.now(), 0))
		}
		if wait > 0 {
			ts := unix.NsecToTimespec(int64(wait))
			fds[0].Revents = 0
			if _, err := unix.Ppoll(fds, &ts, nil); err != nil && err != unix.EINTR {
				return fmt.Errorf("%s: ppoll: %w", p.name, err)
			}
		}
		if err := p.receive(); err != nil {
			return err
		}
		if time.Since(lastReport) > 2*time.Second {
			lastReport = time.Now()
			p.report()
		}
	}
	p.report()
	return nil
}

// receive reads what is waiting (up to a few batches) and queues it.
func (p *pump) receive() error {
	for round := 0; round < 4; round++ {
		k := 0
		for ; k < batch; k++ {
			if p.rxSlots[k] < 0 {
				if len(p.free) == 0 {
					break
				}
				p.rxSlots[k] = p.free[len(p.free)-1]
				p.free = p.free[:len(p.free)-1]
			}
			b := p.slot(p.rxSlots[k])
			p.rxIov[k].Base = &b[0]
			p.rxIov[k].SetLen(slotSize)
			p.rxMsgs[k].hdr = unix.Msghdr{Iov: &p.rxIov[k]}
			p.rxMsgs[k].hdr.SetIovlen(1)
		}
		if k == 0 {
			// Every slot is waiting to be sent: drop one frame to
			// keep the socket moving.
			var sink [slotSize]byte
			if _, _, err := unix.Recvfrom(p.rx, sink[:], unix.MSG_DONTWAIT); err == nil {
				p.stats.NoSlot++
			}
			return nil
		}
		n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(p.rx), uintptr(unsafe.Pointer(&p.rxMsgs[0])), uintptr(k), unix.MSG_DONTWAIT, 0, 0)
		if errno != 0 {
			if errno == unix.EAGAIN || errno == unix.EINTR {
				return nil
			}
			return fmt.Errorf("%s: recvmmsg: %w", p.name, errno)
		}
		now := p.now()
		for i := 0; i < int(n); i++ {
			size := int(p.rxMsgs[i].n)
			if p.rxMsgs[i].hdr.Flags&unix.MSG_TRUNC != 0 || size > slotSize {
				p.stats.Oversize++
				continue // the slot stays lent
			}
			v := p.shaper.Decide(now, size)
			if v.Drop != DropNone {
				continue
			}
			s := p.rxSlots[i]
			p.rxSlots[i] = -1
			p.lens[s] = int32(size)
			p.q.Push(v.At, s)
		}
		if int(n) < k {
			return nil
		}
	}
	return nil
}

// flush sends every frame due at now, in batches.
func (p *pump) flush(now time.Duration) error {
	for {
		k := 0
		for ; k < batch; k++ {
			s, ok := p.q.PopDue(now)
			if !ok {
				break
			}
			p.txSlots[k] = s
			b := p.slot(s)
			p.txIov[k].Base = &b[0]
			p.txIov[k].SetLen(int(p.lens[s]))
			p.txMsgs[k].hdr = unix.Msghdr{Iov: &p.txIov[k]}
			p.txMsgs[k].hdr.SetIovlen(1)
		}
		if k == 0 {
			return nil
		}
		for done, tries := 0, 0; done < k && tries < 2*batch; tries++ {
			n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(p.tx), uintptr(unsafe.Pointer(&p.txMsgs[done])), uintptr(k-done), 0, 0, 0)
			switch {
			case errno == unix.EINTR:
			case errno != 0:
				// The frame at done was refused (ENOBUFS, ...): lose it,
				// as a full device queue would.
				p.stats.SendError++
				done++
			default:
				done += int(n)
				p.stats.Sent += uint64(n)
			}
			if errno != 0 && errno != unix.EINTR && errno != unix.ENOBUFS && errno != unix.EAGAIN && errno != unix.EMSGSIZE {
				return fmt.Errorf("%s: sendmmsg: %w", p.name, errno)
			}
		}
		p.free = append(p.free, p.txSlots[:k]...)
	}
}

// report logs the counters if they changed since the last report.
func (p *pump) report() {
	p.stats.Stats = p.shaper.Stats()
	if p.stats == p.reported {
		return
	}
	p.reported = p.stats
	s := p.stats
	p.log.Info("impair stats", "dir", p.name, "packets", s.Packets, "sent", s.Sent,
		"loss", s.Random, "burst", s.Burst, "queue", s.Queue, "reordered", s.Reordered,
		"oversize", s.Oversize, "noslot", s.NoSlot, "senderr", s.SendError, "held", p.q.Len())
}
