// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

const (
	// copyBufSize is the size of pooled relay buffers.
	copyBufSize = 64 << 10

	// Keepalive settings for the job side of forwarded TCP connections.
	keepaliveIdle     = 60 * time.Second
	keepaliveInterval = 15 * time.Second
)

// copyBufs pools relay buffers shared by TCP and UDP flows.
var copyBufs = sync.Pool{New: func() any {
	b := make([]byte, copyBufSize)
	return &b
}}

// addrPort converts a netstack address and port.
func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return netip.AddrPortFrom(ip.Unmap(), port)
}

// handleTCP is the TCP forwarder's handler, run by gVisor in a new goroutine
// for each SYN: check, dial the destination, and only then complete the
// job's handshake; relay until both directions are done.
func (s *Stack) handleTCP(r *tcp.ForwarderRequest) {
	if !s.enter() {
		r.Complete(false)
		return
	}
	defer s.wg.Done()

	id := r.ID()
	src := addrPort(id.RemoteAddress, id.RemotePort)
	dst := addrPort(id.LocalAddress, id.LocalPort)
	out, lim, ok := s.openTCP(src, dst)
	if !ok {
		r.Complete(true)
		return
	}

	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		out.Close()
		if lim != nil {
			lim.release()
		}
		if s.flowDebugOn() {
			s.log.Debug("tcp accept failed", "src", src, "dst", dst, "err", tcpipError("create endpoint", terr))
		}
		return
	}
	r.Complete(false)
	ep.SocketOptions().SetKeepAlive(true)
	idle := tcpip.KeepaliveIdleOption(keepaliveIdle)
	ep.SetSockOpt(&idle)
	intvl := tcpip.KeepaliveIntervalOption(keepaliveInterval)
	ep.SetSockOpt(&intvl)
	s.serveTCP(newJobConn(&wq, ep), out, src, dst, lim, tcpSegments(ep))
}

// openTCP decides on a job's new TCP flow from src to dst: destination
// check, the job's flow limits, and the dial. It reports false if the job
// must get a reset (refusal and dial failures are counted and logged);
// otherwise it returns the host connection and the job's limits (nil:
// none), which serveTCP releases.
func (s *Stack) openTCP(src, dst netip.AddrPort) (net.Conn, *jobLimits, bool) {
	if err := s.checkFlow(src, policy.ProtoTCP, dst); err != nil {
		s.stats.denied.Add(1)
		if s.flowDebugOn() {
			s.log.Debug("tcp flow denied", "src", src, "dst", dst, "err", err)
		}
		return nil, nil, false
	}
	lim, ok := s.admitFlow(flows.ProtoTCP, src, dst)
	if !ok {
		return nil, nil, false
	}
	network := "tcp4"
	if dst.Addr().Is6() {
		network = "tcp6"
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	out, err := s.dial(ctx, src.Addr(), network, dst)
	cancel()
	if err != nil {
		if lim != nil {
			lim.release()
		}
		s.stats.dialFailures.Add(1)
		if errors.Is(err, portblock.ErrExhausted) {
			s.refuseFlow(flows.ProtoTCP, src, dst, flows.BlockExhausted)
		}
		if s.flowDebugOn() {
			s.log.Debug("tcp dial failed", "src", src, "dst", dst, "err", err)
		}
		return nil, nil, false
	}
	if tc, ok := out.(*net.TCPConn); ok {
		tc.SetKeepAlive(true)
	}
	return out, lim, true
}

// serveTCP relays an established job connection in (job side) and its host
// connection out until both directions are done, then closes both and
// releases lim (nil: none). The flow is recorded in the flow table, with
// its job-side packet counts from pkts (nil: none).
func (s *Stack) serveTCP(in, out net.Conn, src, dst netip.AddrPort, lim *jobLimits, pkts func() (out, in uint64)) {
	if lim != nil {
		defer lim.release()
	}
	s.stats.tcpFlows.Add(1)
	if s.flowDebugOn() {
		s.log.Debug("tcp flow opened", "src", src, "dst", dst)
	}
	f := &connPair{a: in, b: out}
	if !s.track(f) {
		return
	}
	fl := s.openFlow(flows.ProtoTCP, src, dst, flows.Egress)
	if fl != nil {
		fl.SetCloser(f)
		fl.SetPacketCounter(pkts)
		fl.SetPublicPort(localPort(out))
	}
	start := time.Now()
	up, down := s.relayTCP(in, out, s.egressShaper(lim), s.ingressShaper(lim), fl)
	s.untrack(f)
	fl.End(s.endReason()) // before Close: the packet counters may need the sockets
	f.Close()
	if s.flowDebugOn() {
		s.log.Debug("tcp flow closed", "src", src, "dst", dst, "bytes_up", up, "bytes_down", down,
			"duration", time.Since(start))
	}
}

// connPair closes two connections together.
type connPair struct {
	a, b net.Conn
	once sync.Once
}

func (p *connPair) Close() error {
	p.once.Do(func() {
		p.a.Close()
		p.b.Close()
	})
	return nil
}

// closeWriter is implemented by connections that can half-close.
type closeWriter interface {
	CloseWrite() error
}

// relayTCP copies job→host on a new goroutine and host→job on this one,
// propagating half-close, paced by the shapers up (job → host) and down.
// If either direction fails, both connections are closed so the other
// direction ends too. It returns the bytes copied in each direction once
// both are done. Relayed bytes are counted in fl (nil: not counted), in is
// the job's side.
func (s *Stack) relayTCP(in, out net.Conn, up, down *shaper, fl *flows.Flow) (nup, ndown int64) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		nup = halfCopy(out, in, up, fl.AddOut)
	}()
	ndown = halfCopy(in, out, down, newRecvWindow(out).counter(fl.AddIn))
	<-done
	return nup, ndown
}

// halfCopy copies src to dst with a pooled buffer until EOF, then
// half-closes dst, pacing the copy with sh (nil: no pacing). On any other
// error it closes both. count (if not nil) is called with the bytes of
// each chunk written.
func halfCopy(dst, src net.Conn, sh *shaper, count func(n, pkts uint64)) int64 {
	if d, ok := dst.(*net.TCPConn); ok {
		if _, ok := src.(*net.TCPConn); ok {
			return spliceCopy(d, src, sh, count)
		}
	}
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var total int64
	for {
		n, rerr := src.Read(buf[:sh.chunk()])
		if n > 0 {
			if !sh.wait(n) {
				src.Close()
				dst.Close()
				return total
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				dst.Close()
				return total
			}
			total += int64(n)
			if count != nil {
				count(uint64(n), 0)
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				if cw, ok := dst.(closeWriter); ok {
					cw.CloseWrite()
					return total
				}
			}
			src.Close()
			dst.Close()
			return total
		}
	}
}

// spliceCopy is halfCopy between two kernel sockets (the kernel TCP path):
// the bytes move by splice(2) inside the kernel, a chunk at a time, and
// each chunk is paced after it moved, and counted with count (if not nil).
func spliceCopy(dst *net.TCPConn, src net.Conn, sh *shaper, count func(n, pkts uint64)) int64 {
	var total int64
	lr := io.LimitedReader{R: src}
	for {
		lr.N = int64(sh.chunk())
		n, err := dst.ReadFrom(&lr)
		total += n
		if n > 0 && count != nil {
			count(uint64(n), 0)
		}
		if n > 0 && !sh.wait(int(n)) {
			src.Close()
			dst.Close()
			return total
		}
		if err != nil {
			src.Close()
			dst.Close()
			return total
		}
		if lr.N > 0 { // src reached EOF before the chunk was full
			dst.CloseWrite()
			return total
		}
	}
}
