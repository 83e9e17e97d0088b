// SPDX-License-Identifier: MIT

package tunnel

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/conn"
)

// Bind theory of operation: wireguard-go reads from every ReceiveFunc a
// Bind returns in a goroutine of its own and sends through Send with the
// peer's current endpoint. Bind wraps a UDP bind (normally
// conn.StdNetBind) and adds one more ReceiveFunc that yields the messages of
// every attached stream: each stream has a reader goroutine that reads as
// many whole frames as are buffered (at least one, at most BatchSize) into
// one batch and queues it; the ReceiveFunc copies a batch into
// wireguard-go's buffers and reports the stream's endpoint for each
// message. wireguard-go then roams the peer to that endpoint, so replies go
// back over the same stream: the gateway needs no per-peer transport
// state. A client instead pins all sends to one stream with UseStream.

// streamWriteTimeout bounds one write to a stream: a peer that stops
// reading for this long loses its stream.
const streamWriteTimeout = 15 * time.Second

// streamQueue is how many batches may wait for wireguard-go.
const streamQueue = 64

// resendInitWithin is how old the last UDP handshake initiation may be for
// UseStream to resend it over the stream.
const resendInitWithin = 5 * time.Second

// ErrStreamClosed is returned by sends to a stream that has closed.
var ErrStreamClosed = errors.New("tunnel stream closed")

// Bind is a conn.Bind that carries WireGuard messages over UDP and over
// framed streams (TLS connections on the control port, see AppendFrame). It
// is safe for concurrent use; create it with NewBind.
type Bind struct {
	udp conn.Bind
	log *slog.Logger

	in     chan *batch
	forced atomic.Pointer[StreamEndpoint]
	rx, tx atomic.Uint64
	// hsNote holds a value after a handshake message arrived
	// (HandshakeNotify); capacity 1.
	hsNote chan struct{}
	// probe answers path MTU probes (probe.go); nil: none are answered.
	probe *prober

	initMu   sync.Mutex
	lastInit []byte // guarded by initMu: last handshake initiation sent over UDP
	initAt   time.Time

	mu      sync.Mutex
	done    chan struct{} // closed by Close
	closed  bool
	streams map[*StreamEndpoint]struct{}
}

// batch is a run of messages read from one stream.
type batch struct {
	ep    *StreamEndpoint
	buf   []byte
	sizes []int
}

var batchPool = sync.Pool{New: func() any {
	return &batch{buf: make([]byte, 4*MaxFramePayload), sizes: make([]int, 0, conn.IdealBatchSize)}
}}

// NewBind returns a Bind over udp (nil means conn.NewStdNetBind()). Streams
// are attached with AddStream once the bind is open.
func NewBind(udp conn.Bind, logger *slog.Logger) *Bind {
	if udp == nil {
		udp = conn.NewStdNetBind()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Bind{udp: udp, log: logger, in: make(chan *batch, streamQueue), streams: map[*StreamEndpoint]struct{}{},
		hsNote: make(chan struct{}, 1)}
}

// Open opens the UDP bind and returns its receive functions and the
// streams'.
func (b *Bind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	fns, actual, err := b.udp.Open(port)
	if err != nil {
		return nil, 0, err
	}
	for i, fn := range fns {
		fns[i] = b.countHandshakes(fn)
	}
	b.mu.Lock()
	b.done = make(chan struct{})
	b.closed = false
	done := b.done
	b.mu.Unlock()
	return append(fns, b.receiveStreams(done)), actual, nil
}

func (b *Bind) receiveStreams(done chan struct{}) conn.ReceiveFunc {
	return func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		var in *batch
		select {
		case in = <-b.in:
		case <-done:
			return 0, net.ErrClosed
		}
		off, n := 0, 0
		for i, sz := range in.sizes {
			if i >= len(packets) {
				break
			}
			if isHandshake(in.buf[off : off+sz]) {
				b.handshakeMessage()
			}
			copy(packets[i], in.buf[off:off+sz])
			sizes[i] = sz
			eps[i] = in.ep
			off += sz
			n++
		}
		b.rx.Add(uint64(off))
		in.ep = nil
		batchPool.Put(in)
		return n, nil
	}
}

// countHandshakes wraps a UDP receive function to count the handshake
// messages it yields and to answer path MTU probes (probe.go).
func (b *Bind) countHandshakes(fn conn.ReceiveFunc) conn.ReceiveFunc {
	return func(packets [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		n, err := fn(packets, sizes, eps)
		for i := 0; i < n; i++ {
			p := packets[i][:sizes[i]]
			if isHandshake(p) {
				b.handshakeMessage()
			} else if len(p) > 0 && p[0] == probeMagic[0] {
				b.answerProbe(p, eps[i])
			}
		}
		return n, err
	}
}

// isHandshake reports whether p is shaped like a WireGuard handshake
// initiation or response (message type 1 or 2).
func isHandshake(p []byte) bool {
	return len(p) > 0 && (p[0] == 1 || p[0] == 2)
}

// handshakeMessage says on hsNote, without blocking, that a handshake
// message arrived.
func (b *Bind) handshakeMessage() {
	select {
	case b.hsNote <- struct{}{}:
	default:
	}
}

// HandshakeNotify returns a channel that has a value after a handshake
// initiation or response arrived, authenticated or not: a cheap sign that
// a handshake may have completed, to be confirmed with the device (whose
// state is costly to read). Any number of messages since the last receive
// is one value, and one that arrived before the caller looked may be there
// already: the event to confirm with the device, instead of a poll.
func (b *Bind) HandshakeNotify() <-chan struct{} { return b.hsNote }

// Close closes the UDP bind and every stream.
func (b *Bind) Close() error {
	b.mu.Lock()
	if b.done != nil && !b.closed {
		close(b.done)
	}
	b.closed = true
	streams := b.streams
	b.streams = map[*StreamEndpoint]struct{}{}
	b.mu.Unlock()
	for s := range streams {
		s.close(net.ErrClosed)
	}
	return b.udp.Close()
}

// SetMark sets the UDP sockets' mark.
func (b *Bind) SetMark(mark uint32) error { return b.udp.SetMark(mark) }

// ParseEndpoint parses a UDP endpoint.
func (b *Bind) ParseEndpoint(s string) (conn.Endpoint, error) { return b.udp.ParseEndpoint(s) }

// BatchSize is the UDP bind's batch size.
func (b *Bind) BatchSize() int { return b.udp.BatchSize() }

// Send sends bufs to ep: over the stream set with UseStream if there is one,
// else over ep's stream if ep is a *StreamEndpoint, else over UDP. Sends to
// a closed stream are dropped without error (the caller reconnects).
func (b *Bind) Send(bufs [][]byte, ep conn.Endpoint) error {
	if s := b.forced.Load(); s != nil {
		return s.write(bufs)
	}
	if s, ok := ep.(*StreamEndpoint); ok {
		return s.write(bufs)
	}
	for _, p := range bufs {
		if len(p) == wgInitiationSize && p[0] == wgInitiation {
			b.initMu.Lock()
			b.lastInit = append(b.lastInit[:0], p...)
			b.initAt = time.Now()
			b.initMu.Unlock()
		}
	}
	err := b.udp.Send(bufs, ep)
	if err == nil {
		n := 0
		for _, p := range bufs {
			n += len(p)
		}
		b.tx.Add(uint64(n)) // one shared counter update per batch
	}
	return err
}

// UseStream makes every send go over s (nil: back to endpoints, i.e. UDP).
// If a handshake initiation went out over UDP within the last few seconds
// it is sent again over s, so that a handshake that UDP could not complete
// completes at once instead of at wireguard-go's next retry.
func (b *Bind) UseStream(s *StreamEndpoint) {
	b.forced.Store(s)
	if s == nil {
		return
	}
	b.initMu.Lock()
	var init []byte
	if len(b.lastInit) > 0 && time.Since(b.initAt) < resendInitWithin {
		init = append([]byte(nil), b.lastInit...)
	}
	b.lastInit = b.lastInit[:0]
	b.initMu.Unlock()
	if init != nil {
		if err := s.write([][]byte{init}); err != nil {
			b.log.Debug("resend handshake initiation over stream", "err", err)
		}
	}
}

// Stream returns the stream set with UseStream, or nil.
func (b *Bind) Stream() *StreamEndpoint { return b.forced.Load() }

// Bytes returns the WireGuard bytes received and sent over both
// transports since NewBind.
func (b *Bind) Bytes() (rx, tx uint64) { return b.rx.Load(), b.tx.Load() }

// AddStream attaches c, an established stream whose peer is at remote, and
// starts reading frames from it. The bind owns c from now on: it closes c
// when c fails, carries a malformed frame, or the bind closes. name labels
// the stream in logs.
func (b *Bind) AddStream(c net.Conn, remote netip.AddrPort, name string) *StreamEndpoint {
	s := &StreamEndpoint{b: b, c: c, remote: remote, name: name, closed: make(chan struct{})}
	b.mu.Lock()
	if b.closed || b.done == nil {
		b.mu.Unlock()
		s.close(net.ErrClosed)
		return s
	}
	b.streams[s] = struct{}{}
	done := b.done
	b.mu.Unlock()
	go s.readLoop(done)
	return s
}

func (b *Bind) removeStream(s *StreamEndpoint) {
	b.mu.Lock()
	delete(b.streams, s)
	b.mu.Unlock()
	b.forced.CompareAndSwap(s, nil)
}

// StreamEndpoint is one framed stream attached to a Bind, and the
// conn.Endpoint of the peer at its other end. It is safe for concurrent
// use.
type StreamEndpoint struct {
	b      *Bind
	c      net.Conn
	remote netip.AddrPort
	name   string

	wmu  sync.Mutex
	wbuf []byte // guarded by wmu

	closeOnce sync.Once
	closed    chan struct{}
	err       error // why it closed; set before closed is closed
}

// Done is closed when the stream has closed.
func (s *StreamEndpoint) Done() <-chan struct{} { return s.closed }

// Err returns why the stream closed (nil while open).
func (s *StreamEndpoint) Err() error {
	select {
	case <-s.closed:
		return s.err
	default:
		return nil
	}
}

// Close closes the stream.
func (s *StreamEndpoint) Close() { s.close(ErrStreamClosed) }

func (s *StreamEndpoint) close(err error) {
	s.closeOnce.Do(func() {
		s.err = err
		close(s.closed)
		s.c.Close()
		s.b.removeStream(s)
	})
}

func (s *StreamEndpoint) write(bufs [][]byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	select {
	case <-s.closed:
		return nil
	default:
	}
	w := s.wbuf[:0]
	n := 0
	for _, p := range bufs {
		if len(p) > MaxFramePayload {
			return fmt.Errorf("send over stream %s: %d-byte message too large for a frame", s.name, len(p))
		}
		w = AppendFrame(w, p)
		n += len(p)
	}
	s.wbuf = w
	s.c.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	if _, err := s.c.Write(w); err != nil {
		s.close(fmt.Errorf("write: %w", err))
		return fmt.Errorf("send over stream %s: %w", s.name, err)
	}
	s.b.tx.Add(uint64(n))
	return nil
}

func (s *StreamEndpoint) readLoop(done chan struct{}) {
	fr := NewFrameReader(s.c, 4*MaxFramePayload)
	max := s.b.BatchSize()
	for {
		in := batchPool.Get().(*batch)
		in.ep = s
		in.sizes = in.sizes[:0]
		n, err := fr.Next(in.buf)
		if err != nil {
			batchPool.Put(in)
			if errors.Is(err, ErrMalformedFrame) {
				s.b.log.Warn("closing tunnel stream: malformed frame", "stream", s.name, "remote", s.remote, "err", err)
			} else {
				s.b.log.Debug("tunnel stream ended", "stream", s.name, "remote", s.remote, "err", err)
			}
			s.close(err)
			return
		}
		in.sizes = append(in.sizes, n)
		off := n
		for len(in.sizes) < max {
			next, ok := fr.Buffered()
			if !ok || next > len(in.buf)-off {
				break
			}
			n, err := fr.Next(in.buf[off:])
			if err != nil {
				break // reported by the next blocking Next
			}
			in.sizes = append(in.sizes, n)
			off += n
		}
		select {
		case s.b.in <- in:
		case <-s.closed:
			batchPool.Put(in)
			return
		case <-done:
			batchPool.Put(in)
			s.close(net.ErrClosed)
			return
		}
	}
}

// ClearSrc does nothing: a stream has no separate source address.
func (s *StreamEndpoint) ClearSrc() {}

// SrcToString returns "".
func (s *StreamEndpoint) SrcToString() string { return "" }

// DstToString returns "tcp:" and the peer's address.
func (s *StreamEndpoint) DstToString() string { return "tcp:" + s.remote.String() }

// DstToBytes returns the peer's address and port, for cookie MACs.
func (s *StreamEndpoint) DstToBytes() []byte {
	b, _ := s.remote.MarshalBinary()
	return b
}

// DstIP returns the peer's IP address.
func (s *StreamEndpoint) DstIP() netip.Addr { return s.remote.Addr() }

// SrcIP returns the zero address.
func (s *StreamEndpoint) SrcIP() netip.Addr { return netip.Addr{} }

// Remote returns the peer's address.
func (s *StreamEndpoint) Remote() netip.AddrPort { return s.remote }
