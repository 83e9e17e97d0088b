// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/userstack"
)

// stackDialer dials through the client-side user-space TCP/IP stack
// (internal/userstack) attached to the job's WireGuard device: the
// fallback modes' only way out. It implements proxy.Dialer.
type stackDialer struct {
	us *userstack.Stack

	open atomic.Int64 // TCP connections dialed and not yet closed
}

// trackedConn counts itself out of its dialer's open connections on Close.
type trackedConn struct {
	net.Conn
	d    *stackDialer
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.d.open.Add(-1) })
	return c.Conn.Close()
}

// CloseWrite half-closes the connection (gonet supports it).
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// drain waits, at most max, until every TCP connection dialed through the
// stack has been closed, then a moment more so that their last segments
// (FIN, final ACKs) leave through the tunnel before it is torn down. A job
// that exits has closed its sockets; its relays finish the close
// handshakes with the outside here.
func (d *stackDialer) drain(max time.Duration) {
	if d.open.Load() == 0 {
		return
	}
	deadline := time.Now().Add(max)
	for d.open.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
}

// errnoFor maps the stack's errors (gVisor tcpip errors turned into text by
// gonet) to the errno a kernel socket would give, so that intercepted
// programs and proxy clients see ordinary failures.
func errnoFor(err error) error {
	if err == nil {
		return nil
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return err
	}
	s := err.Error()
	for _, m := range []struct {
		text  string
		errno syscall.Errno
	}{
		{"connection was refused", syscall.ECONNREFUSED},
		{"connection refused", syscall.ECONNREFUSED},
		{"connection reset", syscall.ECONNRESET},
		{"no route to host", syscall.EHOSTUNREACH},
		{"host is unreachable", syscall.EHOSTUNREACH},
		{"network is unreachable", syscall.ENETUNREACH},
		{"timed out", syscall.ETIMEDOUT},
		{"deadline exceeded", syscall.ETIMEDOUT},
	} {
		if strings.Contains(s, m.text) {
			return fmt.Errorf("%w (%v)", m.errno, err)
		}
	}
	return err
}

func (d *stackDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	c, err := d.us.DialTCP(ctx, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
	if err != nil {
		return nil, errnoFor(err)
	}
	d.open.Add(1)
	return &trackedConn{Conn: c, d: d}, nil
}

func (d *stackDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	c, err := d.us.DialUDP(netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
	if err != nil {
		return nil, errnoFor(err)
	}
	return c, nil
}

func (d *stackDialer) ListenUDP(ctx context.Context, f *ipfamily.Family) (net.PacketConn, error) {
	c, err := d.us.ListenUDP(f)
	if err != nil {
		return nil, errnoFor(err)
	}
	return c, nil
}

func (d *stackDialer) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	return d.us.LookupHost(ctx, name)
}
