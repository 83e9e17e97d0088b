// SPDX-License-Identifier: MIT

package control

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Idle sessions without goroutines. A goroutine blocked reading a TLS
// connection holds a stack of several KiB, and a gateway holds an idle
// session per running job: thousands of stacks waiting for a renewal every
// half minute. idleWaiter instead puts every idle session's socket into
// one epoll instance (EPOLLONESHOT) watched by one goroutine; when a
// session's socket becomes readable it starts a short-lived goroutine that
// reads and answers what arrived (serverSession.readable) and arms the
// socket again. Go's own poller keeps the socket too, for those reads;
// a socket may be in several epoll instances.
//
// The fd reuse hazard: re-arming a socket after it was closed could touch
// another connection that got the same number. Arming and closing are
// serialised by the session's mutex, and a session is never armed once it
// is closed.

// idleWaiter is safe for concurrent use.
type idleWaiter struct {
	epfd int
	wake int // eventfd that ends run

	// mu guards what follows, and the epoll and eventfd descriptors
	// against being closed while in use.
	mu     sync.Mutex
	next   uint32
	byID   map[uint32]*serverSession
	closed bool
}

// wakeID is the epoll data of the wake eventfd.
const wakeID = 0

func newIdleWaiter() (*idleWaiter, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: wakeID}); err != nil {
		unix.Close(epfd)
		unix.Close(wake)
		return nil, fmt.Errorf("epoll add eventfd: %w", err)
	}
	w := &idleWaiter{epfd: epfd, wake: wake, byID: map[uint32]*serverSession{}}
	go w.run()
	return w, nil
}

// add registers ss (not yet armed): it gets its waiter id and socket.
func (w *idleWaiter) add(ss *serverSession) error {
	sc, ok := ss.rawConn()
	if !ok {
		return errors.New("no socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) { ss.fd = int(fd) }); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		w.next++
		if w.next != wakeID && w.byID[w.next] == nil {
			break
		}
	}
	ss.waitID = w.next
	w.byID[ss.waitID] = ss
	return nil
}

// armLocked makes the waiter call ss.readable once its socket is readable
// (or closed by the peer). The caller holds ss.mu, and ss is not closed.
func (w *idleWaiter) armLocked(ss *serverSession) error {
	ev := &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(ss.waitID)}
	op := unix.EPOLL_CTL_MOD
	if !ss.inEpoll {
		op = unix.EPOLL_CTL_ADD
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return errors.New("the gateway stops")
	}
	if err := unix.EpollCtl(w.epfd, op, ss.fd, ev); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	ss.inEpoll = true
	return nil
}

// remove forgets ss; its socket leaves the epoll set when it is closed.
func (w *idleWaiter) remove(ss *serverSession) {
	w.mu.Lock()
	delete(w.byID, ss.waitID)
	w.mu.Unlock()
}

// run waits for readable sessions until close.
func (w *idleWaiter) run() {
	events := make([]unix.EpollEvent, 128)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range events[:n] {
			id := uint32(ev.Fd)
			if id == wakeID {
				w.mu.Lock()
				unix.Close(w.epfd)
				unix.Close(w.wake)
				w.mu.Unlock()
				return
			}
			w.mu.Lock()
			ss := w.byID[id]
			w.mu.Unlock()
			if ss != nil {
				go ss.readable()
			}
		}
	}
}

// close ends run; sessions still in the set are closed by their owner.
func (w *idleWaiter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	var one [8]byte
	one[0] = 1
	unix.Write(w.wake, one[:])
}
