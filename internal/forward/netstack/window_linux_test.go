// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRecvWindowClamp drains a loopback connection a little slower than
// its sender sends (paced at 20 MB/s against 16), as the relay drains a
// host socket when the job's side is the bottleneck, and reads the window
// the sender is offered. The receive buffer is large, as auto-tuning makes
// it on a real path. Without the governor the window is the buffer's free
// space, megabytes, which is what the sender may burst into the outside
// link; with it the window stays near windowFloor while the receiver lags,
// and the clamp is lifted once the receiver catches up.
func TestRecvWindowClamp(t *testing.T) {
	without := offeredWindow(t, false)
	with := offeredWindow(t, true)
	t.Logf("window offered to a sender outrunning its receiver: %d KiB without the governor, %d KiB with it", without>>10, with>>10)
	if without < 4*windowFloor {
		t.Fatalf("without the governor the window is %d bytes; want it well above %d, or this test proves nothing", without, windowFloor)
	}
	if with > 2*windowFloor {
		t.Errorf("with the governor the window is %d bytes, want at most %d", with, 2*windowFloor)
	}
}

// offeredWindow runs a sender against a slow reader for a bounded time and
// returns the largest window the sender was offered at the end.
// With govern, the reader drains through a recvWindow and, at the end,
// catches up: the clamp must then be lifted.
func offeredWindow(t *testing.T, govern bool) int {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) {
			// Forced where the test may (root); else up to rmem_max.
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
			}
		})
	}}
	ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	snd, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	if rc, err := snd.(*net.TCPConn).SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, 20<<20) })
	}
	rcv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()

	stop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		buf := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			snd.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := snd.Write(buf); err != nil && !isTimeout(err) {
				return
			}
		}
	}()
	defer func() { close(stop); <-sent }()

	var w *recvWindow
	if govern {
		w = newRecvWindow(rcv)
	}
	count := w.counter(nil)
	buf := make([]byte, 32<<10)
	read := func() int {
		rcv.SetReadDeadline(time.Now().Add(time.Second))
		n, err := rcv.Read(buf)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if count != nil {
			count(uint64(n), 0)
		}
		return n
	}
	// 16 MB/s for 900 ms. The window already offered is not taken back
	// (TCP never shrinks it): it shrinks as the sender fills it, so the
	// window is read in the last 150 ms.
	largest := 0
	const rate = 16 << 20
	total := 0
	for start := time.Now(); time.Since(start) < 900*time.Millisecond; {
		if float64(total) >= rate*time.Since(start).Seconds() {
			time.Sleep(time.Millisecond)
			continue
		}
		total += read()
		if time.Since(start) > 750*time.Millisecond {
			largest = max(largest, sendWindow(t, snd))
		}
	}
	if govern {
		if !w.clamped {
			t.Fatal("the receiver lagged but the clamp is not set")
		}
		// Catch up: stop the sender, drain everything; the clamp lifts.
		close(stop)
		<-sent
		stop = make(chan struct{})
		sent = make(chan struct{})
		close(sent)
		for deadline := time.Now().Add(5 * time.Second); w.clamped; {
			if time.Now().After(deadline) {
				t.Fatal("the receiver caught up but the clamp was never lifted")
			}
			rcv.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
			n, err := rcv.Read(buf)
			if err != nil && !isTimeout(err) {
				t.Fatalf("read: %v", err)
			}
			// An empty read still lets the interval end and the governor look.
			time.Sleep(windowInterval / 4)
			count(uint64(n), 0)
		}
	}
	return largest
}

// sendWindow is the window the peer last offered c (tcpi_snd_wnd).
func sendWindow(t *testing.T, c net.Conn) int {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if err != nil {
		t.Fatal(err)
	}
	return int(info.Snd_wnd)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
