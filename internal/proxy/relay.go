package proxy

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
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

func loopback(v6 bool) netip.Addr {
	if v6 {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// PipeTCP returns one end of a new loopback TCP connection (IPv6 loopback
// if v6) whose other end is spliced to remote, for injection into a job
// that asked to connect to remote's peer. The caller owns the file; remote
// is closed when the job's end closes (or at once on error).
func PipeTCP(remote net.Conn, v6 bool) (*os.File, error) {
	l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(loopback(v6), 0)))
	if err != nil {
		remote.Close()
		return nil, fmt.Errorf("loopback listener: %w", err)
	}
	defer l.Close()
	c, err := net.DialTCP("tcp", nil, l.Addr().(*net.TCPAddr))
	if err != nil {
		remote.Close()
		return nil, fmt.Errorf("loopback connection: %w", err)
	}
	defer c.Close()
	// Other local users could connect to the listener too: take only our
	// own connection, known by its source port.
	_ = l.SetDeadline(time.Now().Add(5 * time.Second))
	for {
		a, err := l.AcceptTCP()
		if err != nil {
			remote.Close()
			return nil, fmt.Errorf("loopback accept: %w", err)
		}
		if a.RemoteAddr().String() != c.LocalAddr().String() {
			a.Close()
			continue
		}
		f, err := c.File()
		if err != nil {
			a.Close()
			remote.Close()
			return nil, fmt.Errorf("loopback connection fd: %w", err)
		}
		go Splice(a, remote)
		return f, nil
	}
}

// PipeUDP returns a loopback UDP socket (IPv6 loopback if v6) connected to
// a relay that carries its datagrams to dst through d and the answers
// back. The relay ends with ctx or after UDPIdleTimeout without traffic.
func PipeUDP(ctx context.Context, d Dialer, dst netip.AddrPort, v6 bool) (*os.File, error) {
	u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopback(v6), 0)))
	if err != nil {
		return nil, fmt.Errorf("loopback udp socket: %w", err)
	}
	defer u.Close()
	src, _ := netip.ParseAddrPort(u.LocalAddr().String())
	r, err := newUDPRelay(ctx, d, src, dst, UDPIdleTimeout)
	if err != nil {
		return nil, err
	}
	f, err := u.File()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("loopback udp fd: %w", err)
	}
	if err := connectFile(f, r.Addr()); err != nil {
		f.Close()
		r.Close()
		return nil, err
	}
	return f, nil
}
