// SPDX-License-Identifier: MIT

package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// udpRelay is a loopback UDP socket connected to one local source that
// relays datagrams to and from one destination through the tunnel.
type udpRelay struct {
	local  *net.UDPConn // connected to the job's socket
	tunnel net.Conn     // connected to the destination, through the tunnel
	once   sync.Once
	last   atomic.Int64 // unix nanoseconds of the last datagram either way
	done   atomic.Bool
}

// newUDPRelay starts a relay between src (a loopback address) and dst. It
// ends when ctx is done, on Close, or (idle > 0) after idle without traffic.
func newUDPRelay(ctx context.Context, d Dialer, src, dst netip.AddrPort, idle time.Duration) (*udpRelay, error) {
	lo := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if src.Addr().Is6() && !src.Addr().Is4In6() {
		lo = netip.IPv6Loopback()
	}
	local, err := net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lo, 0)), net.UDPAddrFromAddrPort(src))
	if err != nil {
		return nil, fmt.Errorf("udp relay socket: %w", err)
	}
	tc, err := d.DialUDP(ctx, dst)
	if err != nil {
		local.Close()
		return nil, fmt.Errorf("udp to %v through the tunnel: %w", dst, err)
	}
	r := &udpRelay{local: local, tunnel: tc}
	r.last.Store(time.Now().UnixNano())
	go r.copy(r.tunnel, r.local)
	go r.copy(r.local, r.tunnel)
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				r.Close()
				return
			case <-tick.C:
				if idle > 0 && time.Since(time.Unix(0, r.last.Load())) > idle {
					r.Close()
				}
			}
			if r.closed() {
				return
			}
		}
	}()
	return r, nil
}

func (r *udpRelay) copy(dst, src net.Conn) {
	buf := make([]byte, 65536)
	for {
		n, err := src.Read(buf)
		if err != nil {
			if isClosed(err) || r.closed() {
				return
			}
			// ICMP errors (ECONNREFUSED) on a connected UDP socket are
			// not fatal for the relay.
			continue
		}
		r.last.Store(time.Now().UnixNano())
		_, _ = dst.Write(buf[:n])
	}
}

func (r *udpRelay) closed() bool { return r.done.Load() }

// Addr is the relay's loopback address, which the job's socket sends to.
func (r *udpRelay) Addr() netip.AddrPort {
	ap, _ := netip.ParseAddrPort(r.local.LocalAddr().String())
	return ap
}

// Close ends the relay.
func (r *udpRelay) Close() {
	r.once.Do(func() {
		r.done.Store(true)
		r.local.Close()
		r.tunnel.Close()
	})
}

// Loopback is the kind of loopback socket a pipe hands over: of the job
// socket's family, and for an IPv6 socket that asked for an IPv4 peer, an
// IPv6 socket on IPv4-mapped addresses — what the kernel would have made
// of that connect (getsockname and getpeername name ::ffff:127.0.0.1;
// glibc's getaddrinfo insists on it when it sorts addresses).
type Loopback int

const (
	// Loopback4 is an AF_INET socket on 127.0.0.1.
	Loopback4 Loopback = iota
	// Loopback6 is an AF_INET6 socket on ::1.
	Loopback6
	// Loopback4In6 is an AF_INET6 socket on ::ffff:127.0.0.1, whose peer
	// is an IPv4 socket on 127.0.0.1.
	Loopback4In6
)

// LoopbackFor returns the loopback kind for a job socket of family
// (AF_INET or AF_INET6) connecting to dst, where v6 says whether IPv6
// loopback (::1) works on this host.
func LoopbackFor(family int, dst netip.Addr, v6 bool) Loopback {
	switch {
	case family != syscall.AF_INET6:
		return Loopback4
	case dst.Unmap().Is4():
		return Loopback4In6
	case v6:
		return Loopback6
	}
	return Loopback4 // no ::1 here: the wrong family beats no connection
}

// addr is the address the relay end of a pipe of kind lo listens on.
func (lo Loopback) addr() netip.Addr {
	if lo == Loopback6 {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// PipeTCP returns one end of a new loopback TCP connection of kind lo
// whose other end is spliced to remote, for injection into a job that
// asked to connect to remote's peer. The caller owns the file; remote is
// closed when the job's end closes (or at once on error).
func PipeTCP(remote net.Conn, lo Loopback) (*os.File, error) {
	l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(lo.addr(), 0)))
	if err != nil {
		remote.Close()
		return nil, fmt.Errorf("loopback listener: %w", err)
	}
	defer l.Close()
	f, local, err := loopbackSocket(syscall.SOCK_STREAM, lo, netip.MustParseAddrPort(l.Addr().String()))
	if err != nil {
		remote.Close()
		return nil, fmt.Errorf("loopback connection: %w", err)
	}
	// Other local users could connect to the listener too: take only our
	// own connection, known by its source port.
	_ = l.SetDeadline(time.Now().Add(5 * time.Second))
	for {
		a, err := l.AcceptTCP()
		if err != nil {
			f.Close()
			remote.Close()
			return nil, fmt.Errorf("loopback accept: %w", err)
		}
		if from, err := netip.ParseAddrPort(a.RemoteAddr().String()); err != nil || netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != local {
			a.Close()
			continue
		}
		go Splice(a, remote)
		return f, nil
	}
}

// PipeUDP returns a loopback UDP socket of kind lo connected to a relay
// that carries its datagrams to dst through d and the answers back. The
// relay ends with ctx or after UDPIdleTimeout without traffic.
func PipeUDP(ctx context.Context, d Dialer, dst netip.AddrPort, lo Loopback) (*os.File, error) {
	f, src, err := loopbackSocket(syscall.SOCK_DGRAM, lo, netip.AddrPort{})
	if err != nil {
		return nil, fmt.Errorf("loopback udp socket: %w", err)
	}
	r, err := newUDPRelay(ctx, d, src, dst, UDPIdleTimeout)
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := connectFile(f, lo, r.Addr()); err != nil {
		f.Close()
		r.Close()
		return nil, err
	}
	return f, nil
}
