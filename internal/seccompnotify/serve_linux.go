// SPDX-License-Identifier: MIT

package seccompnotify

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// ioctl numbers missing from x/sys/unix: _IOW('!', 2, __u64) and
// _IOW('!', 3, struct seccomp_notif_addfd).
const (
	ioctlNotifIDValid = 0x40082102
	ioctlNotifAddFD   = 0x40182103
)

// notif is struct seccomp_notif.
type notif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Nr    int32
	Arch  uint32
	IP    uint64
	Args  [6]uint64
}

// notifResp is struct seccomp_notif_resp.
type notifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// notifAddFD is struct seccomp_notif_addfd.
type notifAddFD struct {
	ID         uint64
	Flags      uint32
	SrcFD      uint32
	NewFD      uint32
	NewFDFlags uint32
}

// Connect describes one intercepted connect(2).
type Connect struct {
	Pid      int            // thread that called connect
	FD       int            // the socket's fd number in the job
	Type     int            // SOCK_STREAM, SOCK_DGRAM, …
	Family   int            // AF_INET or AF_INET6 (of the job's socket)
	Dst      netip.AddrPort // the address asked for (IPv4-mapped addresses unmapped)
	Nonblock bool           // the job's socket has O_NONBLOCK
}

// Redirector decides what happens to an intercepted connect. It returns a
// connected socket to install in place of the job's, or (nil, nil) to let
// the kernel perform the call unchanged, or an error whose errno (a
// syscall.Errno in its chain, else ECONNREFUSED) connect returns. The
// returned file is closed by the caller. Redirect is called concurrently.
type Redirector interface {
	Redirect(ctx context.Context, c Connect) (*os.File, error)
}

// Serve answers the notifications on listener until ctx is done or every
// process under the filter has exited, then closes listener. Each
// notification is handled in its own goroutine.
func Serve(ctx context.Context, log *slog.Logger, listener *os.File, r Redirector) error {
	defer listener.Close()
	lfd := int(listener.Fd())
	var wg sync.WaitGroup
	defer wg.Wait()
	limit := rate.NewLimiter(rate.Every(time.Second), 5)
	for {
		if ctx.Err() != nil {
			return nil
		}
		pfd := []unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 250)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("poll seccomp listener: %w", err)
		}
		if n == 0 {
			continue
		}
		if pfd[0].Revents&unix.POLLIN == 0 {
			return nil // POLLHUP: no process is left under the filter
		}
		var nt notif
		if err := ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&nt)); err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINTR) {
				continue // the task died or was interrupted before we read it
			}
			return fmt.Errorf("receive seccomp notification: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := handle(ctx, lfd, &nt, r); err != nil && limit.Allow() {
				log.Debug("seccomp connect", "pid", nt.Pid, "err", err)
			}
		}()
	}
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

func respond(lfd int, id uint64, errno syscall.Errno, cont bool) error {
	r := notifResp{ID: id, Error: -int32(errno)}
	if cont {
		r.Flags = unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
	}
	return ioctl(lfd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&r))
}

func valid(lfd int, id uint64) bool {
	return ioctl(lfd, ioctlNotifIDValid, unsafe.Pointer(&id)) == nil
}

// handle answers one notification; it always responds unless the task is
// gone.
func handle(ctx context.Context, lfd int, nt *notif, r Redirector) error {
	cont := func() error { return respond(lfd, nt.ID, 0, true) }
	if nt.Nr != int32(unix.SYS_CONNECT) {
		return cont()
	}
	fd, ptr, size := int(nt.Args[0]), nt.Args[1], int(nt.Args[2])
	if size < 2 || size > 128 || ptr == 0 {
		return cont()
	}
	buf := make([]byte, size)
	local := []unix.Iovec{{Base: &buf[0], Len: uint64(size)}}
	remote := []unix.RemoteIovec{{Base: uintptr(ptr), Len: size}}
	if n, err := unix.ProcessVMReadv(int(nt.Pid), local, remote, 0); err != nil || n != size {
		return cont() // let the kernel report EFAULT or whatever applies
	}
	if !valid(lfd, nt.ID) {
		return nil
	}
	dst, ok := parseSockaddr(buf)
	if !ok {
		return cont()
	}
	c, err := inspect(int(nt.Pid), fd)
	if err != nil {
		return cont() // not a socket we can read (EBADF …): the kernel says why
	}
	if !valid(lfd, nt.ID) {
		return nil
	}
	c.Dst = dst
	f, err := r.Redirect(ctx, c)
	if err != nil {
		errno := unix.ECONNREFUSED
		var e syscall.Errno
		if errors.As(err, &e) {
			errno = e
		}
		_ = respond(lfd, nt.ID, errno, false)
		return fmt.Errorf("connect %v: %w", dst, err)
	}
	if f == nil {
		return cont()
	}
	defer f.Close()
	if c.Nonblock {
		if err := unix.SetNonblock(int(f.Fd()), true); err != nil {
			_ = respond(lfd, nt.ID, unix.EIO, false)
			return err
		}
	}
	add := notifAddFD{ID: nt.ID, Flags: unix.SECCOMP_ADDFD_FLAG_SETFD, SrcFD: uint32(f.Fd()), NewFD: uint32(fd)}
	if cloexec(int(nt.Pid), fd) {
		add.NewFDFlags = unix.O_CLOEXEC
	}
	if err := ioctl(lfd, ioctlNotifAddFD, unsafe.Pointer(&add)); err != nil {
		_ = respond(lfd, nt.ID, unix.EIO, false)
		return fmt.Errorf("inject socket: %w", err)
	}
	return respond(lfd, nt.ID, 0, false)
}

// parseSockaddr reads an AF_INET or AF_INET6 sockaddr (host-order family,
// network-order port).
func parseSockaddr(b []byte) (netip.AddrPort, bool) {
	family := binary.NativeEndian.Uint16(b)
	switch {
	case family == unix.AF_INET && len(b) >= unix.SizeofSockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4])), true
	case family == unix.AF_INET6 && len(b) >= unix.SizeofSockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])).Unmap(), binary.BigEndian.Uint16(b[2:4])), true
	}
	return netip.AddrPort{}, false
}

// inspect looks at the job's socket through a copy of it (pidfd_getfd).
func inspect(tid, fd int) (Connect, error) {
	c := Connect{Pid: tid, FD: fd}
	pid := tgid(tid)
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return c, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	sfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return c, fmt.Errorf("pidfd_getfd %d/%d: %w", pid, fd, err)
	}
	defer unix.Close(sfd)
	if c.Type, err = unix.GetsockoptInt(sfd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil {
		return c, err
	}
	if c.Family, err = unix.GetsockoptInt(sfd, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil {
		return c, err
	}
	fl, err := unix.FcntlInt(uintptr(sfd), unix.F_GETFL, 0)
	if err != nil {
		return c, err
	}
	c.Nonblock = fl&unix.O_NONBLOCK != 0
	return c, nil
}

// tgid returns the process (thread group) id of thread tid; pidfd_open
// wants a process.
func tgid(tid int) int {
	f, err := os.Open("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return tid
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Tgid:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	return tid
}

// cloexec reports whether fd of task tid has FD_CLOEXEC (from fdinfo).
func cloexec(tid, fd int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", tid, fd))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			fl, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && fl&unix.O_CLOEXEC != 0
		}
	}
	return false
}
