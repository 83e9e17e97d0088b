// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-vpn/airlock/internal/bypass"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/proxy"
)

// bypassDialer is the fallback modes' dialer with site-local bypass:
// destinations a bypass entry matches (and the gateway's policy allows)
// are dialled from the node directly (bypass.Engine.Dial), names in local
// domains resolved by the site resolvers; everything else goes through
// the user-space stack and the tunnel. It implements proxy.Dialer.
type bypassDialer struct {
	*stackDialer
	eng *bypass.Engine
	dns netip.Addr // the tunnel's DNS server
}

var _ proxy.Dialer = bypassDialer{}

// direct dials dst from the node if the bypass takes it; ok is false if
// it does not.
func (d bypassDialer) direct(ctx context.Context, network string, dst netip.AddrPort) (c net.Conn, ok bool, err error) {
	c, err = d.eng.Dial(ctx, network, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
	switch {
	case errors.Is(err, bypass.ErrNotBypassed):
		return nil, false, nil
	case errors.Is(err, bypass.ErrDenied):
		return nil, true, fmt.Errorf("%w (%v)", syscall.ECONNREFUSED, err)
	}
	return c, true, err
}

func (d bypassDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	if c, ok, err := d.direct(ctx, "tcp", dst); ok {
		return c, err
	}
	if dst == netip.AddrPortFrom(d.dns, 53) && len(d.eng.Set().Resolvers()) > 0 {
		return &splitDNSTCP{d: d, ready: make(chan struct{})}, nil
	}
	return d.stackDialer.DialTCP(ctx, dst)
}

func (d bypassDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	if c, ok, err := d.direct(ctx, "udp", dst); ok {
		return c, err
	}
	c, err := d.stackDialer.DialUDP(ctx, dst)
	if err != nil || dst != netip.AddrPortFrom(d.dns, 53) || len(d.eng.Set().Resolvers()) == 0 {
		return c, err
	}
	return newSplitDNS(c, d.eng), nil
}

// ListenUDP opens the tunnel's unconnected UDP socket of family f (SOCKS
// UDP ASSOCIATE) with the bypass in front (bypassPacketConn).
func (d bypassDialer) ListenUDP(ctx context.Context, f *ipfamily.Family) (net.PacketConn, error) {
	pc, err := d.stackDialer.ListenUDP(ctx, f)
	if err != nil {
		return nil, err
	}
	return newBypassPacketConn(pc, d), nil
}

func (d bypassDialer) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	if addrs, ok, err := d.eng.LookupHost(ctx, name); ok {
		return addrs, err
	}
	return d.stackDialer.LookupHost(ctx, name)
}

// splitDNS is a UDP "connection" to the tunnel's DNS server that sends
// queries for local domains to the site resolver from the node instead:
// each Write is one query, each Read one answer from either.
type splitDNS struct {
	tunnel  net.Conn
	eng     *bypass.Engine
	answers chan []byte
	done    chan struct{}

	mu   sync.Mutex
	site net.Conn // guarded by mu: opened on the first local query
	once sync.Once
}

func newSplitDNS(tunnel net.Conn, eng *bypass.Engine) *splitDNS {
	s := &splitDNS{tunnel: tunnel, eng: eng, answers: make(chan []byte, 16), done: make(chan struct{})}
	go s.receive(tunnel)
	return s
}

// receive passes c's datagrams to Read until c fails.
func (s *splitDNS) receive(c net.Conn) {
	for {
		b := make([]byte, 65535)
		n, err := c.Read(b)
		if err != nil {
			return
		}
		select {
		case s.answers <- b[:n]:
		case <-s.done:
			return
		}
	}
}

func (s *splitDNS) Write(b []byte) (int, error) {
	if !s.eng.Set().IsLocal(bypass.QueryName(b)) {
		return s.tunnel.Write(b)
	}
	s.mu.Lock()
	if s.site == nil {
		rs := s.eng.Set().Resolvers()
		c, err := net.DialTimeout("udp", rs[0].String(), bypass.DialTimeout)
		if err != nil {
			s.mu.Unlock()
			return 0, err
		}
		s.site = c
		go s.receive(c)
	}
	c := s.site
	s.mu.Unlock()
	return c.Write(b)
}

func (s *splitDNS) Read(b []byte) (int, error) {
	select {
	case a := <-s.answers:
		return copy(b, a), nil
	case <-s.done:
		return 0, net.ErrClosed
	}
}

func (s *splitDNS) Close() error {
	s.once.Do(func() {
		close(s.done)
		s.tunnel.Close()
		s.mu.Lock()
		if s.site != nil {
			s.site.Close()
		}
		s.mu.Unlock()
	})
	return nil
}

func (s *splitDNS) LocalAddr() net.Addr                { return s.tunnel.LocalAddr() }
func (s *splitDNS) RemoteAddr() net.Addr               { return s.tunnel.RemoteAddr() }
func (s *splitDNS) SetDeadline(t time.Time) error      { return s.tunnel.SetDeadline(t) }
func (s *splitDNS) SetReadDeadline(t time.Time) error  { return s.tunnel.SetReadDeadline(t) }
func (s *splitDNS) SetWriteDeadline(t time.Time) error { return s.tunnel.SetWriteDeadline(t) }

// splitDNSTCP is a TCP "connection" to the tunnel's DNS server (DNS over
// TCP, as the preload library asks) that goes to the site resolver from
// the node instead when its first query is for a local domain. It decides
// once it holds the first whole query (2-byte length, message).
type splitDNSTCP struct {
	d     bypassDialer
	ready chan struct{} // closed once c is set or failed

	mu     sync.Mutex
	buf    []byte   // guarded by mu: the first query so far
	c      net.Conn // set once, before ready closes
	err    error
	closed bool
}

// maxDNSFrame bounds the first query buffered.
const maxDNSFrame = 2 + 65535

func (s *splitDNSTCP) Write(b []byte) (int, error) {
	s.mu.Lock()
	if s.c != nil || s.err != nil {
		c, err := s.c, s.err
		s.mu.Unlock()
		if err != nil {
			return 0, err
		}
		return c.Write(b)
	}
	s.buf = append(s.buf, b...)
	if len(s.buf) < 2 || len(s.buf) < 2+int(binary.BigEndian.Uint16(s.buf)) && len(s.buf) < maxDNSFrame {
		s.mu.Unlock()
		return len(b), nil
	}
	defer s.mu.Unlock()
	return len(b), s.decideLocked()
}

// decideLocked dials the site resolver or the tunnel's DNS server and
// sends what was buffered.
func (s *splitDNSTCP) decideLocked() error {
	defer close(s.ready)
	ctx, cancel := context.WithTimeout(context.Background(), bypass.DialTimeout)
	defer cancel()
	var c net.Conn
	var err error
	if len(s.buf) > 2 && s.d.eng.Set().IsLocal(bypass.QueryName(s.buf[2:])) {
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", s.d.eng.Set().Resolvers()[0].String())
	} else {
		c, err = s.d.stackDialer.DialTCP(ctx, netip.AddrPortFrom(s.d.dns, 53))
	}
	if err == nil && s.closed {
		c.Close()
		err = net.ErrClosed
	}
	if err == nil {
		_, err = c.Write(s.buf)
	}
	s.buf = nil
	s.c, s.err = c, err
	return err
}

func (s *splitDNSTCP) conn() (net.Conn, error) {
	<-s.ready
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c, s.err
}

func (s *splitDNSTCP) Read(b []byte) (int, error) {
	c, err := s.conn()
	if err != nil {
		return 0, err
	}
	return c.Read(b)
}

// CloseWrite sends what was buffered (a short query goes to the tunnel)
// and half-closes.
func (s *splitDNSTCP) CloseWrite() error {
	s.mu.Lock()
	if s.c == nil && s.err == nil {
		s.decideLocked()
	}
	c, err := s.c, s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (s *splitDNSTCP) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.c != nil {
		return s.c.Close()
	}
	if s.err == nil {
		s.err = net.ErrClosed
		close(s.ready)
	}
	return nil
}

func (s *splitDNSTCP) LocalAddr() net.Addr { return &net.TCPAddr{} }
func (s *splitDNSTCP) RemoteAddr() net.Addr {
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(s.d.dns, 53))
}
func (s *splitDNSTCP) SetDeadline(t time.Time) error      { return nil }
func (s *splitDNSTCP) SetReadDeadline(t time.Time) error  { return nil }
func (s *splitDNSTCP) SetWriteDeadline(t time.Time) error { return nil }

// maxBypassSockets bounds the host sockets one bypassPacketConn opens (one
// per bypassed destination, and one to the site resolver).
const maxBypassSockets = 64

// bypassPacketConn is the tunnel's unconnected UDP socket of a SOCKS UDP
// association with the bypass in front: a datagram to a destination a
// bypass entry takes (and the gateway's policy allows) goes from the node
// through a host socket connected to it (one per destination, counted
// under the entry), a query for a local name to the tunnel's DNS server
// goes to the site resolver, the rest into the tunnel; ReadFrom returns
// the replies of all of them, each from the destination the job sent to.
// A datagram a bypass entry takes but the policy denies is dropped.
type bypassPacketConn struct {
	net.PacketConn // the tunnel's
	d              bypassDialer
	in             chan udpDatagram
	done           chan struct{}
	once           sync.Once

	mu     sync.Mutex
	direct map[netip.AddrPort]net.Conn // guarded by mu: host sockets by the job's destination
	site   net.Conn                    // guarded by mu: the site resolver's
}

type udpDatagram struct {
	b    []byte
	from netip.AddrPort
}

func newBypassPacketConn(pc net.PacketConn, d bypassDialer) *bypassPacketConn {
	p := &bypassPacketConn{PacketConn: pc, d: d, in: make(chan udpDatagram, 64), done: make(chan struct{}), direct: map[netip.AddrPort]net.Conn{}}
	go p.receiveTunnel()
	return p
}

// deliver queues a datagram for ReadFrom; false once p is closed.
func (p *bypassPacketConn) deliver(b []byte, from netip.AddrPort) bool {
	select {
	case p.in <- udpDatagram{b, from}:
		return true
	case <-p.done:
		return false
	}
}

func (p *bypassPacketConn) receiveTunnel() {
	for {
		b := make([]byte, 65535)
		n, from, err := p.PacketConn.ReadFrom(b)
		if err != nil {
			p.Close()
			return
		}
		ap, err := netip.ParseAddrPort(from.String())
		if err != nil {
			continue
		}
		if !p.deliver(b[:n], netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())) {
			return
		}
	}
}

// receive passes c's datagrams to ReadFrom as from dst until c fails.
func (p *bypassPacketConn) receive(c net.Conn, dst netip.AddrPort) {
	for {
		b := make([]byte, 65535)
		n, err := c.Read(b)
		if err != nil {
			return
		}
		if !p.deliver(b[:n], dst) {
			return
		}
	}
}

// hostConn returns the host socket for a datagram b to dst, opening it if
// needed; ok is false if the datagram goes into the tunnel.
func (p *bypassPacketConn) hostConn(dst netip.AddrPort, b []byte) (c net.Conn, ok bool, err error) {
	eng := p.d.eng
	if dst == netip.AddrPortFrom(p.d.dns, 53) {
		if !eng.Set().IsLocal(bypass.QueryName(b)) {
			return nil, false, nil
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.site == nil {
			rs := eng.Set().Resolvers()
			if len(rs) == 0 {
				return nil, false, nil
			}
			if p.site, err = net.DialTimeout("udp", rs[0].String(), bypass.DialTimeout); err != nil {
				return nil, true, err
			}
			go p.receive(p.site, dst)
		}
		return p.site, true, nil
	}
	p.mu.Lock()
	c = p.direct[dst]
	n := len(p.direct)
	p.mu.Unlock()
	if c != nil {
		return c, true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), bypass.DialTimeout)
	defer cancel()
	c, err = eng.Dial(ctx, "udp", dst)
	switch {
	case errors.Is(err, bypass.ErrNotBypassed):
		return nil, false, nil
	case err != nil:
		return nil, true, err
	case n >= maxBypassSockets:
		c.Close()
		return nil, true, fmt.Errorf("udp associate: more than %d bypassed destinations", maxBypassSockets)
	}
	p.mu.Lock()
	if old := p.direct[dst]; old != nil {
		p.mu.Unlock()
		c.Close()
		return old, true, nil
	}
	select {
	case <-p.done:
		p.mu.Unlock()
		c.Close()
		return nil, true, net.ErrClosed
	default:
	}
	p.direct[dst] = c
	p.mu.Unlock()
	go p.receive(c, dst)
	return c, true, nil
}

func (p *bypassPacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return p.PacketConn.WriteTo(b, addr)
	}
	dst := netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	c, ok, err := p.hostConn(dst, b)
	switch {
	case !ok:
		return p.PacketConn.WriteTo(b, addr)
	case err != nil:
		return 0, err
	}
	return c.Write(b)
}

func (p *bypassPacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	select {
	case d := <-p.in:
		return copy(b, d.b), net.UDPAddrFromAddrPort(d.from), nil
	case <-p.done:
		return 0, nil, net.ErrClosed
	}
}

// Close closes the tunnel's socket and every host socket.
func (p *bypassPacketConn) Close() error {
	p.once.Do(func() {
		close(p.done)
		p.PacketConn.Close()
		p.mu.Lock()
		for _, c := range p.direct {
			c.Close()
		}
		if p.site != nil {
			p.site.Close()
		}
		p.mu.Unlock()
	})
	return nil
}
