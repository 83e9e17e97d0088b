// SPDX-License-Identifier: MIT

package netstack

// Theory of operation: the outside sender's queue.
//
// A user-mode gateway splits every job TCP connection in two: the outside
// host sends to the gateway's host socket, and the relay writes what it
// reads into the job's side. When the job's side is the slower path (the
// tunnel to the compute node is the bottleneck, as it usually is, since
// the tunnel carries the same bytes plus its own headers), the host socket
// fills and the outside sender becomes receive-window limited. Its window
// is then as large as the socket's auto-tuned buffer (megabytes), and every
// time the relay drains a chunk the sender bursts that much into the
// DMZ's outside link: a standing queue there, which every other job's
// traffic from outside waits behind (a download in one job added 9 ms of
// p99 to another job's round trips through the same gateway on 1 Gbit
// links; root-run wireguard-go, which does not split connections, added 3).
//
// So while the job's side is the bottleneck, recvWindow clamps the window
// the host socket advertises (TCP_WINDOW_CLAMP) to what the drain needs:
// twice the drain rate (the highest of the last few intervals) times the
// path's minimum round trip, and never below windowFloor. That keeps
// the drain fed and leaves at most about one such window queued outside.
// When the socket's receive queue is empty (the relay keeps up, so the
// bottleneck is elsewhere and the sender's queue is its own business, as
// without Airlock) the clamp is lifted. The kernel's auto-tuning may raise
// the clamp as the buffer grows; each interval sets it again.

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// windowFloor is the smallest window the clamp sets: two 64 KiB GSO
	// segments, about 1 ms at 1 Gbit/s. (256 KiB left 2 ms p99 queued on
	// the outside link in bench/run.sh --breakdown; 128 KiB 1 ms, the same
	// as native routing, at the same throughput.)
	windowFloor = 128 << 10
	// windowGain is the window over drain rate × minimum round trip.
	windowGain = 2
	// windowInterval is the shortest interval between two clamp updates.
	windowInterval = 20 * time.Millisecond
	// windowUnclamped is the clamp set when lifting it: more than any
	// receive buffer, so the buffer's free space decides the window again.
	windowUnclamped = 1 << 30
	// windowPeaks is how many intervals' drain rates the peak is taken over.
	windowPeaks = 4
)

// recvWindow governs the receive window of one host connection; observe
// is called by the one goroutine that drains it.
type recvWindow struct {
	rc      syscall.RawConn
	start   time.Time
	drained uint64
	rates   [windowPeaks]float64 // bytes per second, ring
	next    int
	minRTT  time.Duration
	clamped bool
}

// newRecvWindow returns a governor for c, or nil when c is not a kernel
// TCP socket.
func newRecvWindow(c net.Conn) *recvWindow {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return &recvWindow{rc: rc, start: time.Now()}
}

// counter returns count (nil: none) with w's observe in front.
func (w *recvWindow) counter(count func(n, pkts uint64)) func(n, pkts uint64) {
	if w == nil {
		return count
	}
	return func(n, pkts uint64) {
		w.observe(n)
		if count != nil {
			count(n, pkts)
		}
	}
}

// observe records n bytes drained from the socket and, once an interval
// has passed, sets or lifts the clamp.
func (w *recvWindow) observe(n uint64) {
	w.drained += n
	now := time.Now()
	elapsed := now.Sub(w.start)
	interval := max(windowInterval, 2*w.minRTT)
	if elapsed < interval {
		return
	}
	w.rates[w.next] = float64(w.drained) / elapsed.Seconds()
	w.next = (w.next + 1) % windowPeaks
	w.drained, w.start = 0, now
	peak := 0.0
	for _, r := range w.rates {
		peak = max(peak, r)
	}
	_ = w.rc.Control(func(fd uintptr) { w.update(int(fd), peak) })
}

// update reads the socket's state and sets the clamp for peak.
func (w *recvWindow) update(fd int, peak float64) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return
	}
	for _, us := range []uint32{info.Min_rtt, info.Rcv_rtt} {
		if rtt := time.Duration(us) * time.Microsecond; rtt > 0 && (w.minRTT == 0 || rtt < w.minRTT) {
			w.minRTT = rtt
		}
	}
	queued, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		return
	}
	if queued == 0 {
		if w.clamped {
			_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, windowUnclamped)
			w.clamped = false
		}
		return
	}
	win := max(windowFloor, int(windowGain*peak*w.minRTT.Seconds()))
	if unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, win) == nil {
		w.clamped = true
	}
}
