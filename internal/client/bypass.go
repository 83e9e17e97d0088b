package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-vpn/airlock/internal/bypass"
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
	if c, ok, err := d.direct(ctx, "tcp4", dst); ok {
		return c, err
	}
	return d.stackDialer.DialTCP(ctx, dst)
}

func (d bypassDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	if c, ok, err := d.direct(ctx, "udp4", dst); ok {
		return c, err
	}
	c, err := d.stackDialer.DialUDP(ctx, dst)
	if err != nil || dst != netip.AddrPortFrom(d.dns, 53) || len(d.eng.Set().Resolvers()) == 0 {
		return c, err
	}
	return newSplitDNS(c, d.eng), nil
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
