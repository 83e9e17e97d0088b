// SPDX-License-Identifier: MIT

// Package sdservice speaks the two protocols by which a service started by
// systemd tells it how it is: the readiness protocol (sd_notify(3): READY=1,
// RELOADING=1, STOPPING=1 as datagrams to $NOTIFY_SOCKET, for Type=notify)
// and the syslog priority prefix of journal streams (sd-daemon(3): a log
// line that starts with <N> is stored at priority N when stderr is the
// stream $JOURNAL_STREAM names). Both are no-ops for a process that systemd
// did not start, so a foreground run prints what it always printed.
package sdservice

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Notifier sends state changes to the service manager. Its zero value, and
// the value NewNotifier returns without $NOTIFY_SOCKET, sends nothing. It
// is safe for concurrent use.
type Notifier struct {
	addr *net.UnixAddr // nil: not started by systemd with Type=notify
}

// NewNotifier returns a Notifier for getenv("NOTIFY_SOCKET"): a path, or an
// abstract socket as @name. Other forms (vsock) are an error.
func NewNotifier(getenv func(string) string) (*Notifier, error) {
	s := getenv("NOTIFY_SOCKET")
	switch {
	case s == "":
		return &Notifier{}, nil
	case s[0] == '/' || s[0] == '@':
		return &Notifier{addr: &net.UnixAddr{Name: s, Net: "unixgram"}}, nil
	}
	return nil, fmt.Errorf("NOTIFY_SOCKET=%q: want a path or @name", s)
}

// Enabled reports whether n sends anything.
func (n *Notifier) Enabled() bool { return n != nil && n.addr != nil }

// Notify sends state, newline-separated VAR=VALUE assignments, in one
// datagram. It returns when systemd's socket has it (or with the error).
func (n *Notifier) Notify(state string) error {
	if !n.Enabled() {
		return nil
	}
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return fmt.Errorf("notify systemd at %s: %w", n.addr.Name, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return fmt.Errorf("notify systemd at %s: %w", n.addr.Name, err)
	}
	return nil
}

// Ready says that the service is up (again, after Reloading).
func (n *Notifier) Ready(status string) error { return n.Notify(withStatus("READY=1", status)) }

// Reloading says that the service reloads its configuration; Ready ends
// it. MONOTONIC_USEC, which systemd 253 and later want beside it, is
// CLOCK_MONOTONIC now.
func (n *Notifier) Reloading() error {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("notify systemd: clock_gettime: %w", err)
	}
	return n.Notify(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", time.Duration(ts.Nano())/time.Microsecond))
}

// Stopping says that the service is shutting down.
func (n *Notifier) Stopping() error { return n.Notify("STOPPING=1") }

// withStatus appends a STATUS= line (one line: newlines become spaces).
func withStatus(state, status string) string {
	if status == "" {
		return state
	}
	return state + "\nSTATUS=" + strings.ReplaceAll(status, "\n", " ")
}

// OnJournal reports whether f is the journal stream systemd connected the
// service's output to: $JOURNAL_STREAM is "DEVICE:INODE" of that stream,
// and a child that inherited the variable with other output is not on it.
func OnJournal(f *os.File, getenv func(string) string) bool {
	var dev, ino uint64
	if _, err := fmt.Sscanf(getenv("JOURNAL_STREAM"), "%d:%d", &dev, &ino); err != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return uint64(st.Dev) == dev && st.Ino == ino
}
