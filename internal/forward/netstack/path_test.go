// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"io"
	"net"
	"net/netip"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/flows"
)

// rawFlow is one job TCP connection driven packet by packet against a Stack
// through Write and Read, with no job-side stack: it builds its segments
// itself and acknowledges what it receives. It measures the gateway's
// packet path alone.
type rawFlow struct {
	s *Stack
	// dev is s behind the capture decorator, as the gateway runs it;
	// Write and Read go through it.
	dev      *capture.Device
	src, dst netip.AddrPort
	mss      int

	// Owned by the sender (the test goroutine).
	sndNxt uint32
	sent   int         // data segments sent
	probe  *time.Timer // wakes a sender waiting for a window update
	out    [][]byte    // prebuilt data segments, rewritten per batch

	// Owned by the reader goroutine.
	rcvNxt uint32
	ack    []byte

	mu       sync.Mutex
	cond     *sync.Cond
	est      bool   // SYN-ACK seen
	peerISS  uint32 // gateway's initial sequence number
	ws       uint8  // gateway's window scale
	acked    uint32 // highest ACK from the gateway
	wnd      uint32 // gateway's receive window, scaled
	received int64  // payload bytes received in order
	err      error

	stop func()
}

const (
	rawMSS   = 1380
	rawBatch = 32 // segments per Write: one WireGuard batch
)

// newRawFlow starts a Stack whose destination 198.51.100.7:80 is a local
// server running serve, and completes a handshake with it.
func newRawFlow(tb testing.TB, serve func(net.Conn)) *rawFlow {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	d := newDialer()
	d.route("198.51.100.7:80", ln.Addr().String())
	// With a flow table, as the gateway runs it: its accounting is on
	// the measured path.
	s, err := New(Config{Logger: testLogger(), Addrs: []netip.Prefix{gwPrefix}, Dial: d.Dial, Flows: flows.New(flows.Config{}),
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	if err != nil {
		tb.Fatal(err)
	}
	f := &rawFlow{
		s:      s,
		dev:    capture.NewDevice(s, nil),
		src:    netip.AddrPortFrom(jobAddr, 40000),
		dst:    netip.MustParseAddrPort("198.51.100.7:80"),
		mss:    rawMSS,
		sndNxt: 1000,
		ack:    make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize),
	}
	f.cond = sync.NewCond(&f.mu)
	f.probe = time.AfterFunc(time.Hour, f.cond.Broadcast)
	f.probe.Stop()
	for range rawBatch {
		f.out = append(f.out, make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize+f.mss))
	}
	done := make(chan struct{})
	go f.readLoop(done)
	f.stop = func() {
		s.Close()
		<-done
		ln.Close()
	}
	tb.Cleanup(f.stop)

	// SYN with MSS and window scale; the gateway dials, then answers.
	var opts [8]byte
	n := header.EncodeMSSOption(uint32(f.mss), opts[:])
	n += header.EncodeNOP(opts[n:])
	n += header.EncodeWSOption(7, opts[n:])
	syn := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize+n)
	f.build(syn, header.TCPFlagSyn, f.sndNxt, 0, opts[:n], 0)
	f.write(syn)
	f.sndNxt++
	f.mu.Lock()
	deadline := time.AfterFunc(5*time.Second, func() {
		f.mu.Lock()
		if !f.est {
			f.err = io.ErrUnexpectedEOF
		}
		f.cond.Broadcast()
		f.mu.Unlock()
	})
	for !f.est && f.err == nil {
		f.cond.Wait()
	}
	deadline.Stop()
	err = f.err
	f.mu.Unlock()
	if err != nil {
		tb.Fatalf("handshake: %v", err)
	}
	ack := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize)
	f.build(ack, header.TCPFlagAck, f.sndNxt, f.rcvNxt, nil, 0)
	f.write(ack)
	return f
}

// build writes an IPv4/TCP segment with payloadLen payload bytes (left as
// they are in b) into b.
func (f *rawFlow) build(b []byte, flags header.TCPFlags, seq, ack uint32, opts []byte, payloadLen int) {
	tcpLen := header.TCPMinimumSize + len(opts)
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(header.IPv4MinimumSize + tcpLen + payloadLen),
		TTL:         64,
		Protocol:    uint8(header.TCPProtocolNumber),
		SrcAddr:     tcpip.AddrFrom4(f.src.Addr().As4()),
		DstAddr:     tcpip.AddrFrom4(f.dst.Addr().As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(b[header.IPv4MinimumSize:])
	tcp.Encode(&header.TCPFields{
		SrcPort:    f.src.Port(),
		DstPort:    f.dst.Port(),
		SeqNum:     seq,
		AckNum:     ack,
		DataOffset: uint8(tcpLen),
		Flags:      flags,
		WindowSize: 0xffff,
	})
	copy(tcp[header.TCPMinimumSize:], opts)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(tcpLen+payloadLen))
	tcp.SetChecksum(0)
	tcp.SetChecksum(^checksum.Checksum(b[header.IPv4MinimumSize:header.IPv4MinimumSize+tcpLen+payloadLen], xsum))
}

func (f *rawFlow) write(bufs ...[]byte) {
	if _, err := f.dev.Write(bufs, 0); err != nil {
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
	}
}

// sendBatch waits for the gateway's window to admit at least one segment
// and writes up to rawBatch segments in one Write. It returns how many it
// sent, 0 once the flow failed.
func (f *rawFlow) sendBatch() int {
	f.mu.Lock()
	room := func() int { return int(int32(f.acked+f.wnd-f.sndNxt)) / f.mss }
	for f.err == nil && room() < 1 {
		// A real sender probes a closed window; so does this one if no
		// window update arrives within 20 ms, by resending the last
		// byte, which the gateway acknowledges at once.
		acked := f.acked
		f.probe.Reset(20 * time.Millisecond)
		f.cond.Wait()
		f.probe.Stop()
		if f.err == nil && room() < 1 && f.acked == acked && f.sndNxt != acked {
			ack := f.rcvNxt
			f.mu.Unlock()
			probe := f.out[0][:header.IPv4MinimumSize+header.TCPMinimumSize+1]
			f.build(probe, header.TCPFlagAck, f.sndNxt-1, ack, nil, 1)
			f.write(probe)
			f.mu.Lock()
		}
	}
	k := min(room(), rawBatch)
	ack, err := f.rcvNxt, f.err
	f.mu.Unlock()
	if err != nil {
		return 0
	}
	for _, b := range f.out[:k] {
		f.build(b, header.TCPFlagAck, f.sndNxt, ack, nil, f.mss)
		f.sndNxt += uint32(f.mss)
	}
	f.write(f.out[:k]...)
	f.sent += k
	return k
}

// readLoop reads what the gateway sends, records ACKs and windows, and
// acknowledges in-order data once per Read.
func (f *rawFlow) readLoop(done chan<- struct{}) {
	defer close(done)
	bufs := make([][]byte, 128)
	for i := range bufs {
		bufs[i] = make([]byte, 2048)
	}
	sizes := make([]int, len(bufs))
	for {
		n, err := f.dev.Read(bufs, sizes, 0)
		if err != nil {
			f.mu.Lock()
			f.err = err
			f.cond.Broadcast()
			f.mu.Unlock()
			return
		}
		f.mu.Lock()
		got := false
		for i := range n {
			p := bufs[i][:sizes[i]]
			ip := header.IPv4(p)
			if len(p) < header.IPv4MinimumSize || ip.Protocol() != uint8(header.TCPProtocolNumber) {
				continue
			}
			tcp := header.TCP(p[ip.HeaderLength():])
			if tcp.DestinationPort() != f.src.Port() {
				continue
			}
			flags := tcp.Flags()
			if flags&header.TCPFlagRst != 0 {
				f.err = io.ErrUnexpectedEOF
				continue
			}
			if flags&header.TCPFlagSyn != 0 {
				syn := header.ParseSynOptions(tcp.Options(), true)
				if syn.WS > 0 {
					f.ws = uint8(syn.WS)
				}
				f.peerISS = tcp.SequenceNumber()
				f.rcvNxt = f.peerISS + 1
				f.est = true
			}
			if a := tcp.AckNumber(); int32(a-f.acked) > 0 || f.acked == 0 {
				f.acked = a
			}
			if flags&header.TCPFlagSyn != 0 {
				f.wnd = uint32(tcp.WindowSize()) // never scaled in a SYN
			} else {
				f.wnd = uint32(tcp.WindowSize()) << f.ws
			}
			if payload := len(p) - int(ip.HeaderLength()) - int(tcp.DataOffset()); payload > 0 && tcp.SequenceNumber() == f.rcvNxt {
				f.rcvNxt += uint32(payload)
				f.received += int64(payload)
				got = true
			}
		}
		f.cond.Broadcast()
		ack := f.rcvNxt
		f.mu.Unlock()
		if got {
			f.build(f.ack, header.TCPFlagAck, f.sndNxt, ack, nil, 0)
			f.write(f.ack)
		}
	}
}

// discard is a destination that reads everything.
func discard(c net.Conn) { io.Copy(io.Discard, c) }

// source is a destination that writes until the connection fails.
func source(c net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

// BenchmarkPacketPathUp measures Stack.Write, per packet, with batches of
// up to rawBatch MSS-sized segments of one established flow (GRO, TCP receive, relay to a host
// socket) plus the ACKs Read hands back.
func BenchmarkPacketPathUp(b *testing.B) {
	f := newRawFlow(b, discard)
	b.SetBytes(rawMSS)
	b.ReportAllocs()
	b.ResetTimer()
	for sent := 0; sent < b.N; {
		k := f.sendBatch()
		if k == 0 {
			b.Fatalf("flow failed: %v", f.err)
		}
		sent += k
	}
}

// BenchmarkPacketPathDown measures the gateway sending a bulk flow to the
// job: host socket → netstack TCP (GSO segments) → Read splitting them
// into MSS-sized packets, with one ACK written per Read.
func BenchmarkPacketPathDown(b *testing.B) {
	f := newRawFlow(b, source)
	want := int64(64 << 10)
	b.SetBytes(want)
	b.ReportAllocs()
	b.ResetTimer()
	f.mu.Lock()
	for f.received < int64(b.N)*want && f.err == nil {
		f.cond.Wait()
	}
	f.mu.Unlock()
}

// TestPacketPathAllocs checks the per-packet allocations of the job→host
// hot path: a Write of rawBatch data segments to an established flow,
// through the capture decorator (no capture attached, then one capturing
// every packet), GRO, TCP, the relay to the host socket, and the ACKs read
// back. The whole process's allocations count, so this includes the relay
// and the test's own reader.
func TestPacketPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("bulk transfer")
	}
	if raceEnabled {
		t.Skip("the race detector allocates; allocation counts need a normal build")
	}
	t.Run("no capture", func(t *testing.T) { testPacketPathAllocs(t, false) })
	t.Run("capture", func(t *testing.T) { testPacketPathAllocs(t, true) })
}

func testPacketPathAllocs(t *testing.T, capturing bool) {
	f := newRawFlow(t, discard)
	if capturing {
		tap := f.dev.NewTap(capture.TapConfig{Name: "test"})
		f.dev.Attach(tap)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); tap.Serve(ctx, io.Discard, nil) }()
		t.Cleanup(func() { cancel(); <-done; f.dev.Detach(tap) })
	}
	// A GC empties the sync.Pools that gVisor's buffers come from, and
	// refilling them is a cost per GC, not per packet: keep GC out of the
	// measurement.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// One P: gVisor's buffers come from sync.Pools, whose caches are per
	// P; with several, a buffer put back on one P and wanted on another is
	// a pool miss, an allocation that depends on where the scheduler ran
	// each goroutine (this test failed on a quiet 2-core machine that way),
	// not on the path.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for range 3000 { // warm pools and buffers up
		if f.sendBatch() == 0 {
			t.Fatalf("flow failed: %v", f.err)
		}
	}
	const runs = 500
	sent0 := f.sent
	perBatch := testing.AllocsPerRun(runs, func() {
		if f.sendBatch() == 0 {
			t.Fatalf("flow failed: %v", f.err)
		}
	})
	// AllocsPerRun calls the function once more to warm up.
	perPacket := perBatch * runs / float64(f.sent-sent0)
	t.Logf("allocations: %.2f per Write of %.1f packets on average, %.3f per packet", perBatch, float64(f.sent-sent0)/(runs+1), perPacket)
	if perPacket > maxAllocsPerPacket {
		t.Errorf("allocations per packet: got %.3f, want <= %v", perPacket, maxAllocsPerPacket)
	}
}

// maxAllocsPerPacket bounds TestPacketPathAllocs. The path allocates
// nothing per packet; the slack admits a rare amortised allocation (a
// pool refill after GC).
const maxAllocsPerPacket = 0.05
