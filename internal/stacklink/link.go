// SPDX-License-Identifier: MIT

// Package stacklink connects a gVisor netstack to a WireGuard device, for
// both of airlock's user-space stacks: the gateway's user-mode egress
// (internal/forward/netstack) and airlock run's client-side stack in the
// fallback modes (internal/userstack). It holds the link endpoint (Link)
// and the stack options both use (StackOptions, TuneTCP).
//
// # Theory of operation: the link endpoint
//
// The NIC is backed by Link, which replaces gVisor's channel endpoint for
// throughput:
//
// Inbound (WireGuard → netstack): Inject wraps each decrypted packet of a
// batch in a PacketBuffer and feeds it to a GRO engine (gvisor
// pkg/tcpip/stack/gro), which coalesces consecutive in-order segments of a
// TCP flow into one large segment; the batch is flushed when Inject
// returns, so GRO never holds a packet between calls. The netstack then
// runs TCP once per coalesced segment instead of once per packet.
//
// Outbound (netstack → WireGuard): the endpoint advertises host GSO, so the
// netstack's TCP sends segments of up to gsoMaxSize bytes with a partial
// (pseudo-header) checksum. WritePackets queues them under a mutex with one
// wake-up per batch. Read hands the WireGuard device whole batches: each
// large segment is split into MSS-sized IP packets with their own IP ID,
// lengths, sequence numbers, flags and full checksums, written straight
// into the device's buffers. A segment that does not fit the remaining
// buffers is continued by the next Read.
package stacklink

import (
	"context"
	"sync"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"
)

const (
	// gsoMaxSize is the largest segment the netstack's TCP may emit.
	gsoMaxSize = 1<<16 - 1

	// groFlushRounds is how many times gro.GRO.Flush must run to empty
	// the engine: this gVisor version's Flush delivers only the oldest
	// packet of each bucket, and a bucket holds at most 8.
	groFlushRounds = 8
)

var (
	_ stack.LinkEndpoint = (*Link)(nil)
	_ stack.GSOEndpoint  = (*Link)(nil)
)

// Link is a NIC's link endpoint; see the theory of operation above. It is
// safe for concurrent use. Create it with New.
type Link struct {
	mtu   uint32
	limit int // most packets queued outbound; more are dropped

	// ready has a token when the outbound queue may be non-empty.
	ready chan struct{}

	// gros pools GRO engines so that concurrent Writes (one per peer)
	// need no lock.
	gros sync.Pool

	// dmu guards dispatcher.
	dmu        sync.RWMutex
	dispatcher stack.NetworkDispatcher

	// mu guards the outbound queue.
	mu     sync.Mutex
	q      []*stack.PacketBuffer
	closed bool

	// rmu serializes readers and guards the reader's state: rq is the
	// batch taken from q, rqi its next packet, seg the next segment of
	// rq[rqi] when it is being split.
	rmu sync.Mutex
	rq  []*stack.PacketBuffer
	rqi int
	seg int

	// dropped counts outbound packets dropped because the queue was full
	// or they did not fit a buffer.
	dropped func()

	// notify, if set before use (SetNotify), is called after packets
	// were queued outbound.
	notify func()
}

// New returns a link of MTU mtu that queues at most limit outbound
// packets; dropped, if not nil, is called for every outbound packet
// dropped because the queue was full or it did not fit a buffer.
func New(mtu uint32, limit int, dropped func()) *Link {
	if dropped == nil {
		dropped = func() {}
	}
	e := &Link{
		mtu:     mtu,
		limit:   limit,
		ready:   make(chan struct{}, 1),
		q:       make([]*stack.PacketBuffer, 0, limit),
		rq:      make([]*stack.PacketBuffer, 0, limit),
		dropped: dropped,
	}
	e.gros.New = func() any {
		g := new(gro.GRO)
		g.Init(true)
		return g
	}
	return e
}

// Inject delivers the inbound packets bufs[i][offset:] that admit accepts
// to the netstack, through GRO, and returns how many admit refused. admit
// keeps a packet out with ok false: with protocol 0 it refused it, with any
// other protocol it took the packet over itself (ICMP echo relay). The
// buffers are copied and not retained.
func (e *Link) Inject(bufs [][]byte, offset int, admit func([]byte) (tcpip.NetworkProtocolNumber, bool)) (refused int) {
	e.dmu.RLock()
	d := e.dispatcher
	e.dmu.RUnlock()
	if d == nil {
		return len(bufs)
	}
	g := e.gros.Get().(*gro.GRO)
	g.Dispatcher = d
	for _, b := range bufs {
		if offset > len(b) {
			refused++
			continue
		}
		proto, ok := admit(b[offset:])
		if !ok {
			if proto == 0 {
				refused++
			}
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b[offset:])})
		pkt.NetworkProtocolNumber = proto
		pkt.RXChecksumValidated = true // see Capabilities
		g.Enqueue(pkt)
		pkt.DecRef()
	}
	for range groFlushRounds {
		g.Flush()
	}
	g.Dispatcher = nil
	e.gros.Put(g)
	return refused
}

// WritePackets implements stack.LinkWriter: it queues outbound packets for
// read, dropping what does not fit the queue.
func (e *Link) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return 0, &tcpip.ErrClosedForSend{}
	}
	n := 0
	for _, pkt := range pkts.AsSlice() {
		if len(e.q) >= e.limit {
			break
		}
		e.q = append(e.q, pkt.IncRef())
		n++
	}
	e.mu.Unlock()
	if n > 0 {
		select {
		case e.ready <- struct{}{}:
		default:
		}
		if e.notify != nil {
			e.notify()
		}
	}
	if n == 0 && pkts.Len() > 0 {
		return 0, &tcpip.ErrNoBufferSpace{}
	}
	return n, nil
}

// Deliver queues the raw IP packet p (copied) for Read, as if the netstack
// had sent it. It reports false if the queue is full or closed.
func (e *Link) Deliver(p []byte) bool {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(p)})
	defer pkt.DecRef()
	var l stack.PacketBufferList
	l.PushBack(pkt)
	n, err := e.WritePackets(l)
	return err == nil && n == 1
}

// Read blocks until at least one packet is queued, then writes up to
// len(bufs) IP packets into bufs[i][offset:] and their lengths into
// sizes[i], splitting GSO segments. It returns ok false once ctx is done
// or the endpoint is closed.
func (e *Link) Read(ctx context.Context, bufs [][]byte, sizes []int, offset int) (int, bool) {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	for {
		if e.rqi == len(e.rq) {
			if !e.takeLocked(ctx) {
				return 0, false
			}
		}
		if n := e.fillLocked(bufs, sizes, offset); n > 0 {
			return n, true
		}
	}
}

// fillLocked writes packets of the reader's batch into bufs and returns
// how many. e.rmu must be held.
func (e *Link) fillLocked(bufs [][]byte, sizes []int, offset int) int {
	n := 0
	for n < len(bufs) && e.rqi < len(e.rq) {
		pkt := e.rq[e.rqi]
		k, done := e.emit(pkt, bufs[n:], sizes[n:], offset)
		n += k
		if !done {
			break
		}
		pkt.DecRef()
		e.rq[e.rqi] = nil
		e.rqi++
		e.seg = 0
	}
	return n
}

// TryRead is Read without blocking: it returns 0 if no packet is queued
// (or the endpoint is closed).
func (e *Link) TryRead(bufs [][]byte, sizes []int, offset int) int {
	e.rmu.Lock()
	defer e.rmu.Unlock()
	for {
		if e.rqi == len(e.rq) {
			e.rq, e.rqi = e.rq[:0], 0
			e.mu.Lock()
			if e.closed || len(e.q) == 0 {
				e.mu.Unlock()
				return 0
			}
			e.q, e.rq = e.rq, e.q
			e.mu.Unlock()
		}
		if n := e.fillLocked(bufs, sizes, offset); n > 0 {
			return n
		}
	}
}

// takeLocked waits for queued packets and moves them to the reader's
// batch. e.rmu must be held and the batch consumed.
func (e *Link) takeLocked(ctx context.Context) bool {
	e.rq, e.rqi = e.rq[:0], 0
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return false
		}
		if len(e.q) > 0 {
			e.q, e.rq = e.rq, e.q
			e.mu.Unlock()
			return true
		}
		e.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			return false
		}
	}
}

// emit writes pkt, from segment e.seg on, into bufs. It returns how many
// buffers it filled and whether pkt is finished.
func (e *Link) emit(pkt *stack.PacketBuffer, bufs [][]byte, sizes []int, offset int) (int, bool) {
	gso := pkt.GSOOptions
	if gso.Type != stack.GSOTCPv4 && gso.Type != stack.GSOTCPv6 {
		if !copyPacket(bufs[0][offset:], pkt, &sizes[0]) {
			e.dropped()
			return 0, true
		}
		return 1, true
	}
	nh, th := len(pkt.NetworkHeader().Slice()), len(pkt.TransportHeader().Slice())
	hdrLen := nh + th
	payload := pkt.Size() - hdrLen
	mss := int(gso.MSS)
	if mss <= 0 || payload <= mss {
		mss = payload
	}
	segs := 1
	if payload > 0 {
		segs = (payload + mss - 1) / mss
	}
	n := 0
	for ; e.seg < segs && n < len(bufs); e.seg++ {
		off := e.seg * mss
		seglen := min(mss, payload-off)
		dst := bufs[n][offset:]
		if hdrLen+seglen > len(dst) {
			e.dropped()
			continue
		}
		copyRange(dst[:hdrLen], pkt, 0)
		copyRange(dst[hdrLen:hdrLen+seglen], pkt, hdrLen+off)
		finishSegment(dst[:hdrLen+seglen], nh, gso.Type == stack.GSOTCPv4, e.seg, segs, off)
		sizes[n] = hdrLen + seglen
		n++
	}
	return n, e.seg == segs
}

// finishSegment fixes the headers of segment i of segs of a TCP GSO packet,
// p = IP header (nh bytes) | TCP header | payload that started at payload
// offset off: lengths, IPv4 ID and checksum, sequence number, flags, and
// the full TCP checksum.
func finishSegment(p []byte, nh int, v4 bool, i, segs, off int) {
	tcp := header.TCP(p[nh:])
	var xsum uint16
	if v4 {
		ip := header.IPv4(p)
		ip.SetTotalLength(uint16(len(p)))
		if i > 0 {
			ip.SetID(ip.ID() + uint16(i))
		}
		ip.SetChecksum(0)
		ip.SetChecksum(^ip.CalculateChecksum())
		xsum = header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(p)-nh))
	} else {
		ip := header.IPv6(p)
		ip.SetPayloadLength(uint16(len(p) - header.IPv6MinimumSize))
		xsum = header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(p)-nh))
	}
	if segs > 1 {
		tcp.SetSequenceNumber(tcp.SequenceNumber() + uint32(off))
		flags := tcp.Flags()
		if i > 0 {
			flags &^= header.TCPFlagCwr
		}
		if i < segs-1 {
			flags &^= header.TCPFlagFin | header.TCPFlagPsh
		}
		tcp.SetFlags(uint8(flags))
	}
	tcp.SetChecksum(0)
	tcp.SetChecksum(^checksum.Checksum(p[nh:], xsum))
}

// copyRange fills dst with pkt's bytes from offset off (counted from the
// start of the network header).
func copyRange(dst []byte, pkt *stack.PacketBuffer, off int) {
	vl, voff := pkt.AsViewList()
	off += voff
	n := 0
	for v := vl.Front(); v != nil && n < len(dst); v = v.Next() {
		b := v.AsSlice()
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n += copy(dst[n:], b[off:])
		off = 0
	}
}

// Close implements stack.NetworkLinkEndpoint: it drops queued packets and
// wakes readers; pending and later Reads return ok false.
func (e *Link) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	for i, pkt := range e.q {
		pkt.DecRef()
		e.q[i] = nil
	}
	e.q = e.q[:0]
	e.mu.Unlock()
	select {
	case e.ready <- struct{}{}:
	default:
	}
}

// SetNotify makes the link call f after it has queued outbound packets (so
// that a reader blocked elsewhere than in Read can wake). It must be called
// before the link is used.
func (e *Link) SetNotify(f func()) { e.notify = f }

// Attach implements stack.NetworkLinkEndpoint.
func (e *Link) Attach(d stack.NetworkDispatcher) {
	e.dmu.Lock()
	e.dispatcher = d
	e.dmu.Unlock()
}

// IsAttached implements stack.NetworkLinkEndpoint.
func (e *Link) IsAttached() bool {
	e.dmu.RLock()
	defer e.dmu.RUnlock()
	return e.dispatcher != nil
}

// MTU implements stack.NetworkLinkEndpoint.
func (e *Link) MTU() uint32 { return e.mtu }

// SetMTU implements stack.NetworkLinkEndpoint; the MTU is fixed.
func (e *Link) SetMTU(uint32) {}

// MaxHeaderLength implements stack.NetworkLinkEndpoint: no link header.
func (*Link) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.NetworkLinkEndpoint: none.
func (*Link) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.NetworkLinkEndpoint; ignored.
func (*Link) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.NetworkLinkEndpoint. Inbound packets skip
// checksum verification: WireGuard has authenticated every byte from the
// job's own stack, so a checksum could only catch the job's own bugs, and
// the netstack's GRO would otherwise verify each packet once more.
// Outbound checksums are computed (by the stack, or by Read for TCP).
func (*Link) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload
}

// GSOMaxSize implements stack.GSOEndpoint.
func (*Link) GSOMaxSize() uint32 { return gsoMaxSize }

// SupportedGSO implements stack.GSOEndpoint: Read splits segments.
func (*Link) SupportedGSO() stack.SupportedGSO { return stack.HostGSOSupported }

// Wait implements stack.NetworkLinkEndpoint.
func (*Link) Wait() {}

// ARPHardwareType implements stack.NetworkLinkEndpoint.
func (*Link) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.NetworkLinkEndpoint: no link header.
func (*Link) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.NetworkLinkEndpoint: no link header.
func (*Link) ParseHeader(*stack.PacketBuffer) bool { return true }

// SetOnCloseAction implements stack.NetworkLinkEndpoint.
func (*Link) SetOnCloseAction(func()) {}

// AdmitIP is an admit function for Inject that takes IPv4 and IPv6 packets
// of at least a header's length and refuses others.
func AdmitIP(p []byte) (tcpip.NetworkProtocolNumber, bool) {
	switch {
	case len(p) >= header.IPv4MinimumSize && p[0]>>4 == 4:
		return ipv4.ProtocolNumber, true
	case len(p) >= header.IPv6MinimumSize && p[0]>>4 == 6:
		return ipv6.ProtocolNumber, true
	}
	return 0, false
}

// copyPacket copies pkt into dst and sets *size, without allocating. It
// returns false if pkt does not fit.
func copyPacket(dst []byte, pkt *stack.PacketBuffer, size *int) bool {
	n := pkt.Size()
	if n > len(dst) {
		return false
	}
	copyRange(dst[:n], pkt, 0)
	*size = n
	return true
}
