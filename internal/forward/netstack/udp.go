// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// dnsUDPIdleTimeout caps the idle timeout of UDP flows to port 53.
const dnsUDPIdleTimeout = 30 * time.Second

// handleUDP is the UDP forwarder's handler, called synchronously on the
// inbound packet path for a datagram that matches no flow yet. It must not
// block: it creates the flow's netstack endpoint (which takes this first
// datagram) and leaves dialling to the flow's goroutine. Denied datagrams
// are dropped.
func (s *Stack) handleUDP(r *udp.ForwarderRequest) {
	id := r.ID()
	src := addrPort(id.RemoteAddress, id.RemotePort)
	dst := addrPort(id.LocalAddress, id.LocalPort)
	if err := s.checkFlow(src, policy.ProtoUDP, dst); err != nil {
		s.stats.denied.Add(1)
		if s.flowDebugOn() {
			s.log.Debug("udp datagram denied", "src", src, "dst", dst, "err", err)
		}
		return
	}
	lim, ok := s.admitFlow(flows.ProtoUDP, src, dst)
	if !ok {
		return
	}
	if !s.enter() {
		if lim != nil {
			lim.release()
		}
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		s.wg.Done()
		if lim != nil {
			lim.release()
		}
		if s.flowDebugOn() {
			s.log.Debug("udp flow failed", "src", src, "dst", dst, "err", tcpipError("create endpoint", terr))
		}
		return
	}
	in := gonet.NewUDPConn(&wq, ep)
	s.stats.udpFlows.Add(1)
	go func() {
		defer s.wg.Done()
		if lim != nil {
			defer lim.release()
		}
		s.relayUDP(in, endpointReadable(&wq, ep), src, dst, lim)
	}()
}

// relayUDP dials the destination and relays datagrams both ways until the
// flow is idle in both directions for the idle timeout or the Stack closes.
// Datagrams over the bandwidth limits of job j (nil: none) are dropped.
// inReady waits until in has a datagram (endpointReadable).
func (s *Stack) relayUDP(in *gonet.UDPConn, inReady readyFunc, src, dst netip.AddrPort, j *jobLimits) {
	network := "udp4"
	if dst.Addr().Is6() {
		network = "udp6"
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	out, err := s.dial(ctx, src.Addr(), network, dst)
	cancel()
	if err != nil {
		in.Close()
		s.stats.dialFailures.Add(1)
		if errors.Is(err, portblock.ErrExhausted) {
			s.refuseFlow(flows.ProtoUDP, src, dst, flows.BlockExhausted)
		}
		if s.flowDebugOn() {
			s.log.Debug("udp dial failed", "src", src, "dst", dst, "err", err)
		}
		return
	}
	f := &connPair{a: in, b: out}
	if !s.track(f) {
		return
	}
	fl := s.openFlow(flows.ProtoUDP, src, dst, flows.Egress)
	if fl != nil {
		fl.SetCloser(f)
		fl.SetPublicPort(localPort(out))
	}
	if s.flowDebugOn() {
		s.log.Debug("udp flow opened", "src", src, "dst", dst)
	}

	idle := s.cfg.UDPIdleTimeout
	if dst.Port() == dnsPort && idle > dnsUDPIdleTimeout {
		idle = dnsUDPIdleTimeout
	}
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{})
	var up int64
	go func() {
		defer close(done)
		up = pumpUDP(out, in, inReady, &last, idle, f, s.egressShaper(j), &s.limits.dropped, fl.AddOut)
	}()
	down := pumpUDP(in, out, socketReadable(out), &last, idle, f, s.ingressShaper(j), &s.limits.dropped, fl.AddIn)
	<-done
	s.untrack(f)
	f.Close()
	fl.End(s.idleReason())
	if s.flowDebugOn() {
		s.log.Debug("udp flow closed", "src", src, "dst", dst, "bytes_up", up, "bytes_down", down)
	}
}

// pumpUDP copies datagrams from src to dst, recording activity in last. It
// returns, closing the flow, when neither direction has seen traffic for
// idle, or on a read error other than a reported ICMP unreachable. Write
// errors (e.g. the destination's port is closed) drop the datagram, and
// so does sh when the datagram is over its limits (counted in dropped).
// count is called with each datagram relayed. ready, if not nil, waits
// until src has a datagram, so that the flow holds a relay buffer only
// while it relays one: an idle flow (every job's DNS and first datagrams
// keep theirs for the idle timeout) held two 64-KiB buffers, most of an
// idle gateway's memory per job after a storm.
func pumpUDP(dst, src net.Conn, ready readyFunc, last *atomic.Int64, idle time.Duration, f *connPair, sh *shaper, dropped *atomic.Uint64, count func(n, pkts uint64)) int64 {
	var bp *[]byte
	defer func() {
		if bp != nil {
			putUDPBuf(bp)
		}
	}()
	var total int64
	// The deadline is only moved when it fires, not per datagram.
	deadline := time.Unix(0, last.Load()).Add(idle)
	src.SetReadDeadline(deadline)
	for {
		var (
			n   int
			err error
		)
		if ready != nil {
			if bp != nil {
				putUDPBuf(bp)
				bp = nil
			}
			err = ready(deadline)
		}
		if err == nil {
			if bp == nil {
				bp = getUDPBuf()
			}
			n, err = src.Read(*bp)
		}
		if err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				deadline = time.Unix(0, last.Load()).Add(idle)
				if time.Now().Before(deadline) {
					src.SetReadDeadline(deadline)
					continue
				}
			case errors.Is(err, syscall.ECONNREFUSED):
				continue
			}
			f.Close()
			return total
		}
		last.Store(time.Now().UnixNano())
		if !sh.allow(n) {
			dropped.Add(1)
			continue
		}
		if _, err := dst.Write((*bp)[:n]); err == nil {
			total += int64(n)
			count(uint64(n), 1)
		}
	}
}

// readyFunc waits until a connection has a datagram to read, or deadline
// (os.ErrDeadlineExceeded), or the connection fails or closes (its error).
type readyFunc func(deadline time.Time) error

// endpointReadable waits for a datagram on the netstack endpoint ep of
// waiter queue wq.
func endpointReadable(wq *waiter.Queue, ep tcpip.Endpoint) readyFunc {
	return func(deadline time.Time) error {
		if ep.Readiness(waiter.ReadableEvents) != 0 {
			return nil
		}
		e, ch := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
		wq.EventRegister(&e)
		defer wq.EventUnregister(&e)
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		for ep.Readiness(waiter.ReadableEvents|waiter.EventHUp|waiter.EventErr) == 0 {
			select {
			case <-ch:
			case <-t.C:
				return os.ErrDeadlineExceeded
			}
		}
		return nil
	}
}

// socketReadable waits for a datagram on c's socket (with c's read
// deadline), looking with MSG_PEEK; nil if c has no socket (then the pump
// reads at once, holding its buffer). A reported ICMP unreachable is
// taken and waited past, as the pump does.
func socketReadable(c net.Conn) readyFunc {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return func(time.Time) error {
		var perr error
		err := rc.Read(func(fd uintptr) bool {
			var b [1]byte
			_, _, e := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT|unix.MSG_TRUNC)
			switch {
			case e == nil:
				return true
			case e == unix.EAGAIN || e == unix.ECONNREFUSED || e == unix.EINTR:
				return false
			default:
				perr = e
				return true
			}
		})
		if err == nil {
			err = perr
		}
		return err
	}
}

// udpBufsHeld counts the relay buffers that UDP flows hold (a gauge for
// tests: an idle flow holds none).
var udpBufsHeld atomic.Int64

func getUDPBuf() *[]byte {
	udpBufsHeld.Add(1)
	return copyBufs.Get().(*[]byte)
}

func putUDPBuf(bp *[]byte) {
	udpBufsHeld.Add(-1)
	copyBufs.Put(bp)
}
