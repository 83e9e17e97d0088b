// SPDX-License-Identifier: MIT

package netstack

// Theory of operation: kernel TCP.
//
// With Config.KernelTCP set, jobs' TCP to outside destinations, of each
// address family the private namespace carries (usernet.Namespace's
// Subnets), does not enter the gVisor netstack. It goes into a TUN in a
// private user and network namespace (internal/usernet), where the host
// kernel's own TCP, with the host's congestion control (e.g. bbr) and
// TSO/GRO, terminates it on one transparent listener; the Stack
// re-originates each accepted connection as an ordinary host socket from
// the job's port block, as the netstack path does. Everything else (UDP,
// ICMP, DNS, any TCP to the gateway's tunnel addresses, which includes
// exposed ports' replies, and IPv6 TCP behind extension headers) stays in
// the netstack.
//
// The job must still see a refusal, not a connection that opens and then
// resets, when the destination is denied, a limit is reached, or the
// outside host refuses. So Write holds each job's SYN (SYN without ACK)
// back from the kernel: it checks, admits and dials the destination first
// (openTCP, shared with the netstack path) and only when the dial succeeds
// writes the held SYN into the TUN; on failure it answers the job with a
// TCP reset itself. Retransmitted SYNs are dropped while the dial runs and
// passed to the kernel after it. When the kernel's listener accepts the
// connection, its 4-tuple finds the dialled host connection and the two are
// relayed (serveTCP, shared). A dialled connection whose job never
// completes the handshake is closed after acceptTimeout.
//
// Read merges the two sources for the WireGuard device: packets the
// netstack queued (served first, without blocking) and packets the
// kernel sends to jobs, read from the TUN (TSO segments are split by
// wireguard-go's TUN code). While Read blocks on the TUN, a packet queued
// by the netstack interrupts it (mqtun.Device.Wake: a read deadline in
// the past).
//
// The TUN may have several queues (usernet.Namespace.TUN, internal/mqtun):
// the WireGuard device then reads the Stack with one goroutine per queue,
// each Read waiting on a queue of its own, and each Write goes to the
// queue of its job's address, so jobs on different queues share no lock.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/mqtun"
	"github.com/airlock-vpn/airlock/internal/usernet"
)

const (
	// acceptTimeout is how long a dialled connection waits for the job's
	// handshake to complete in the kernel.
	acceptTimeout = 15 * time.Second
	// acceptedLinger keeps an accepted flow's entry so that a duplicate
	// SYN still in flight goes to the kernel instead of opening a second
	// host connection.
	acceptedLinger = 3 * time.Second
	// synOffset is the headroom before a held SYN, for the TUN's virtio
	// header.
	synOffset = 16
)

// kflow states.
const (
	kDialing = iota
	kReady
	kAccepted
)

// kflowKey is a job's TCP flow: job address and port, destination.
type kflowKey struct{ src, dst netip.AddrPort }

// kflow is a job's TCP flow between its first SYN and the kernel's accept.
type kflow struct {
	state int
	syn   []byte // the held SYN at syn[synOffset:]
	out   net.Conn
	lim   *jobLimits
	timer *time.Timer
}

// kernelTCP is the Stack's kernel TCP path; see the theory of operation.
type kernelTCP struct {
	s   *Stack
	dev *mqtun.Device // the private namespace's TUN queues, offloads on
	ns  *usernet.Namespace
	ln  *net.TCPListener
	// carries says which address families' TCP goes to the kernel.
	carries [ipfamily.N]bool

	// pending is set when the netstack may have queued packets for
	// jobs (notify), so that reads skip the netstack's queue lock while
	// it is idle: the readers of every queue would take it per batch.
	pending atomic.Bool

	splits sync.Pool // *splitBatch

	mu      sync.Mutex
	flows   map[kflowKey]*kflow
	dialing int
}

// splitBatch holds one Write's packets for the kernel and the netstack.
type splitBatch struct{ kern, rest [][]byte }

// newKernelTCP takes over ns.
func newKernelTCP(s *Stack, ns *usernet.Namespace) (*kernelTCP, error) {
	var fds []int
	for _, f := range ns.TUN {
		sc, err := f.SyscallConn()
		if err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("kernel tcp: tun fd: %w", err)
		}
		fd, derr := -1, error(nil)
		if err := sc.Control(func(raw uintptr) { fd, derr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("kernel tcp: tun fd: %w", err)
		}
		if derr != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("kernel tcp: dup tun fd: %w", derr)
		}
		fds = append(fds, fd)
	}
	dev, err := mqtun.FromFDs(fds)
	if err != nil {
		return nil, fmt.Errorf("kernel tcp: open tun: %w", err)
	}
	k := &kernelTCP{s: s, dev: dev, ns: ns, ln: ns.Listener, flows: make(map[kflowKey]*kflow)}
	k.pending.Store(true) // nothing missed before the first notify
	for _, p := range ns.Subnets {
		k.carries[ipfamily.Of(p.Addr()).Index] = true
	}
	k.splits.New = func() any {
		return &splitBatch{kern: make([][]byte, 0, 128), rest: make([][]byte, 0, 128)}
	}
	return k, nil
}

// start runs the accept loop.
func (k *kernelTCP) start() {
	k.s.goStart(k.acceptLoop)
}

// close stops the accept loop and closes the TUN and namespace, and every
// dialled connection not yet accepted.
func (k *kernelTCP) close() {
	k.ln.Close()
	k.dev.Close()
	k.ns.Close()
	k.mu.Lock()
	for key, f := range k.flows {
		k.dropLocked(key, f)
	}
	k.mu.Unlock()
}

// dropLocked forgets f and closes its host connection if it has one.
func (k *kernelTCP) dropLocked(key kflowKey, f *kflow) {
	if k.flows[key] == f {
		delete(k.flows, key)
	}
	if f.state == kDialing {
		return // open finishes it
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	if f.out != nil {
		f.out.Close()
		f.out = nil
		if f.lim != nil {
			f.lim.release()
		}
	}
}

// Verdicts of divert.
const (
	toNetstack = iota
	toKernel
	consumed
)

// write sends bufs[i][offset:] to the kernel or the netstack.
func (k *kernelTCP) write(bufs [][]byte, offset int) {
	b := k.splits.Get().(*splitBatch)
	for _, p := range bufs {
		switch k.divert(p, offset) {
		case toKernel:
			b.kern = append(b.kern, p)
		case toNetstack:
			b.rest = append(b.rest, p)
		}
	}
	if len(b.kern) > 0 {
		if _, err := k.dev.Write(b.kern, offset); err != nil {
			k.s.stats.dropped.Add(uint64(len(b.kern)))
		}
	}
	if len(b.rest) > 0 {
		if refused := k.s.ep.Inject(b.rest, offset, k.s.admit); refused > 0 {
			k.s.stats.dropped.Add(uint64(refused))
		}
	}
	clear(b.kern)
	clear(b.rest)
	b.kern, b.rest = b.kern[:0], b.rest[:0]
	k.splits.Put(b)
}

// divert decides where the packet p[offset:] goes; see the theory of
// operation.
func (k *kernelTCP) divert(p []byte, offset int) int {
	if offset > len(p) {
		return toNetstack // refused there
	}
	pkt := p[offset:]
	f := ipfamily.OfPacket(pkt)
	if f == nil || !k.carries[f.Index] || len(pkt) < f.HeaderLen {
		return toNetstack
	}
	// IPv6 TCP behind extension headers has another next header here:
	// the netstack takes it.
	if pkt[f.ProtoOff] != uint8(header.TCPProtocolNumber) || k.s.isSelf(f, pkt[f.DstOff:f.DstOff+f.Bits/8]) {
		return toNetstack
	}
	off, _, ok := f.PayloadOffset(pkt)
	if !ok || f == ipfamily.V4 && header.IPv4(pkt).More() || len(pkt) < off+header.TCPMinimumSize {
		return toKernel // fragments and runts: the kernel reassembles or drops them
	}
	tcp := header.TCP(pkt[off:])
	if fl := tcp.Flags(); fl&header.TCPFlagSyn == 0 || fl&header.TCPFlagAck != 0 {
		return toKernel
	}
	src, dst := f.Addr(pkt, f.SrcOff), f.Addr(pkt, f.DstOff)
	return k.syn(kflowKey{netip.AddrPortFrom(src, tcp.SourcePort()), netip.AddrPortFrom(dst, tcp.DestinationPort())}, pkt)
}

// syn handles a job's SYN: the first one of a flow starts the dial and is
// held; repeats wait for it or pass once it is done.
func (k *kernelTCP) syn(key kflowKey, pkt []byte) int {
	k.mu.Lock()
	if f, ok := k.flows[key]; ok {
		st := f.state
		k.mu.Unlock()
		if st == kDialing {
			return consumed
		}
		return toKernel
	}
	if k.dialing >= k.s.cfg.MaxInFlightSYN {
		k.mu.Unlock()
		return consumed // the job retransmits
	}
	syn := make([]byte, synOffset+len(pkt))
	copy(syn[synOffset:], pkt)
	f := &kflow{state: kDialing, syn: syn}
	k.flows[key] = f
	k.dialing++
	k.mu.Unlock()
	if !k.s.goStart(func() { k.open(key, f) }) {
		k.mu.Lock()
		k.dialing--
		delete(k.flows, key)
		k.mu.Unlock()
	}
	return consumed
}

// open dials for f and then releases its SYN to the kernel, or resets the
// job.
func (k *kernelTCP) open(key kflowKey, f *kflow) {
	out, lim, ok := k.s.openTCP(key.src, key.dst)
	k.mu.Lock()
	k.dialing--
	if !ok || k.flows[key] != f {
		if k.flows[key] == f {
			delete(k.flows, key)
		}
		k.mu.Unlock()
		if ok {
			out.Close()
			if lim != nil {
				lim.release()
			}
		}
		k.reset(f.syn[synOffset:])
		return
	}
	f.state, f.out, f.lim = kReady, out, lim
	f.timer = time.AfterFunc(acceptTimeout, func() {
		k.mu.Lock()
		if f.state == kReady {
			k.dropLocked(key, f)
		}
		k.mu.Unlock()
	})
	k.mu.Unlock()
	if _, err := k.dev.Write([][]byte{f.syn}, synOffset); err != nil {
		k.s.stats.dropped.Add(1) // the job retransmits its SYN, which now passes
	}
}

// reset answers the job's SYN syn (a packet divert took: its family's
// fixed header, then TCP) with a TCP reset from its destination.
func (k *kernelTCP) reset(syn []byte) {
	f := ipfamily.OfPacket(syn)
	off, _, _ := f.PayloadOffset(syn)
	th := header.TCP(syn[off:])
	src := tcpip.AddrFromSlice(syn[f.DstOff : f.DstOff+f.Bits/8])
	dst := tcpip.AddrFromSlice(syn[f.SrcOff : f.SrcOff+f.Bits/8])
	b := make([]byte, f.HeaderLen+header.TCPMinimumSize)
	if f == ipfamily.V4 {
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
			SrcAddr: src, DstAddr: dst,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
	} else {
		header.IPv6(b).Encode(&header.IPv6Fields{
			PayloadLength: header.TCPMinimumSize, TransportProtocol: header.TCPProtocolNumber, HopLimit: 64,
			SrcAddr: src, DstAddr: dst,
		})
	}
	tcp := header.TCP(b[f.HeaderLen:])
	tcp.Encode(&header.TCPFields{
		SrcPort: th.DestinationPort(), DstPort: th.SourcePort(),
		AckNum: th.SequenceNumber() + 1, DataOffset: header.TCPMinimumSize,
		Flags: header.TCPFlagRst | header.TCPFlagAck,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, header.TCPMinimumSize)
	tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
	if !k.s.ep.Deliver(b) {
		k.s.stats.dropped.Add(1)
	}
}

// acceptLoop pairs each connection the kernel accepts with its dialled
// host connection and relays them.
func (k *kernelTCP) acceptLoop() {
	for {
		c, err := k.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || k.s.closing.Load() {
				return
			}
			if !k.s.noteNoFiles(err, "where", "kernel tcp accept") && k.s.flowLog.Allow() {
				k.s.log.Warn("kernel tcp: accept", "err", err)
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		src := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		dst := c.LocalAddr().(*net.TCPAddr).AddrPort()
		key := kflowKey{netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())}
		k.mu.Lock()
		f := k.flows[key]
		if f == nil || f.state != kReady {
			k.mu.Unlock()
			c.SetLinger(0)
			c.Close()
			continue
		}
		f.state = kAccepted
		f.timer.Stop()
		out, lim := f.out, f.lim
		f.out, f.lim = nil, nil
		time.AfterFunc(acceptedLinger, func() {
			k.mu.Lock()
			if k.flows[key] == f {
				delete(k.flows, key)
			}
			k.mu.Unlock()
		})
		k.mu.Unlock()
		c.SetKeepAlive(true)
		c.SetKeepAlivePeriod(keepaliveIdle)
		k.s.stats.kernelTCPFlows.Add(1)
		if !k.s.goStart(func() { k.s.serveTCP(c, out, key.src, key.dst, lim, tcpInfoSegments(c)) }) {
			c.Close()
			out.Close()
			if lim != nil {
				lim.release()
			}
		}
	}
}

// read fills bufs with packets for jobs, from the netstack first, then
// from the kernel. Several goroutines may call it at once, one per TUN
// queue.
func (k *kernelTCP) read(bufs [][]byte, sizes []int, offset int) (int, error) {
	for {
		if k.pending.Swap(false) {
			if n := k.s.ep.TryRead(bufs, sizes, offset); n > 0 {
				k.pending.Store(true) // there may be more
				return n, nil
			}
		}
		if k.s.closing.Load() {
			return 0, os.ErrClosed
		}
		n, err := k.dev.Read(bufs, sizes, offset)
		if n > 0 {
			return n, nil
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded): // woken: the netstack queued packets
		case k.s.closing.Load() || errors.Is(err, os.ErrClosed):
			return 0, os.ErrClosed
		default:
			// A segment that does not fit bufs (tun.ErrTooManySegments)
			// or a bad packet from the kernel: dropped, TCP recovers.
			k.s.stats.dropped.Add(1)
		}
	}
}

// notify wakes a read blocked on the TUN because the netstack queued
// packets.
func (k *kernelTCP) notify() {
	k.pending.Store(true)
	k.dev.Wake()
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
