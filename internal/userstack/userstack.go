// SPDX-License-Identifier: MIT

// Package userstack is airlock run's client-side user-space TCP/IP stack
// for the fallback modes (no user namespace or TUN): a gVisor netstack
// attached to the job's WireGuard device in place of a TUN, from which the
// client's proxies and relays dial the job's connections. Everything it
// sends leaves through the tunnel with the job's own address (IPv4, or
// IPv6 when the lease has one), so the gateway applies the job's policy,
// limits and port block as for a netns job.
//
// It uses the same link endpoint (internal/stacklink.Link: GRO inbound, GSO
// outbound, batched reads) and TCP tuning (stacklink.TuneTCP: SACK, buffer
// auto-tuning up to 8 MiB, cubic) as the gateway's user-mode egress.
package userstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.zx2c4.com/wireguard/tun"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/stacklink"
)

const (
	nicID     = 1
	batchSize = 64
	queueLen  = 1024

	// dnsTimeout bounds one DNS exchange; dnsTries is how often a query
	// is sent over UDP before giving up.
	dnsTimeout = 2 * time.Second
	dnsTries   = 2
)

// Config configures a Stack.
type Config struct {
	// Addrs are the job's tunnel addresses (from the lease), at most one
	// per address family: the stack dials destinations of each family
	// from it, and with an IPv6 one looks up AAAA records first. A family
	// without one is unreachable (ENETUNREACH). Required: at least one.
	Addrs []netip.Addr
	// DNS lists the tunnel's DNS servers.
	DNS []netip.Addr
	// MTU of the tunnel.
	MTU int
}

// Stack is the client-side netstack. It implements tun.Device for the
// WireGuard device and dials through it. It is safe for concurrent use;
// its zero value is not usable (use New).
type Stack struct {
	cfg Config
	// addr are cfg.Addrs by family (zero: none).
	addr   [ipfamily.N]netip.Addr
	ns     *stack.Stack
	link   *stacklink.Link
	events chan tun.Event
	ctx    context.Context
	cancel context.CancelFunc
	once   sync.Once
}

// New builds the stack with cfg.Addrs as its addresses and default routes
// into the tunnel.
func New(cfg Config) (*Stack, error) {
	if len(cfg.Addrs) == 0 || cfg.MTU <= 0 {
		return nil, fmt.Errorf("user-space stack: need an address and an MTU, got %v and %d", cfg.Addrs, cfg.MTU)
	}
	var addr [ipfamily.N]netip.Addr
	for _, a := range cfg.Addrs {
		f := ipfamily.Of(a)
		if f == nil || a.Is4In6() || addr[f.Index].IsValid() {
			return nil, fmt.Errorf("user-space stack: addresses %v: want at most one per family", cfg.Addrs)
		}
		addr[f.Index] = a
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stack{
		addr:   addr,
		cfg:    cfg,
		link:   stacklink.New(uint32(cfg.MTU), queueLen, nil),
		events: make(chan tun.Event, 1),
		ctx:    ctx,
		cancel: cancel,
	}
	opts := stacklink.StackOptions()
	opts.HandleLocal = true
	s.ns = stack.New(opts)
	if err := s.setup(); err != nil {
		s.Close()
		return nil, err
	}
	s.events <- tun.EventUp
	return s, nil
}

func tcpipErr(what string, err tcpip.Error) error {
	return fmt.Errorf("user-space stack: %s: %s", what, err)
}

func (s *Stack) setup() error {
	if err := stacklink.TuneTCP(s.ns); err != nil {
		return fmt.Errorf("user-space stack: %w", err)
	}
	if err := s.ns.CreateNIC(nicID, s.link); err != nil {
		return tcpipErr("create nic", err)
	}
	for _, a := range s.cfg.Addrs {
		pa := tcpip.ProtocolAddress{
			Protocol:          proto(a),
			AddressWithPrefix: tcpip.AddrFromSlice(a.AsSlice()).WithPrefix(),
		}
		if err := s.ns.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return tcpipErr(fmt.Sprintf("add address %v", a), err)
		}
	}
	s.ns.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})
	return nil
}

func proto(a netip.Addr) tcpip.NetworkProtocolNumber {
	if a.Is4() {
		return ipv4.ProtocolNumber
	}
	return ipv6.ProtocolNumber
}

func full(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(ap.Addr().Unmap().AsSlice()), Port: ap.Port()}
}

// File implements tun.Device; there is no file.
func (s *Stack) File() *os.File { return nil }

// Name implements tun.Device.
func (s *Stack) Name() (string, error) { return "airlock-userstack", nil }

// MTU implements tun.Device.
func (s *Stack) MTU() (int, error) { return s.cfg.MTU, nil }

// Events implements tun.Device: EventUp once, closed by Close.
func (s *Stack) Events() <-chan tun.Event { return s.events }

// BatchSize implements tun.Device.
func (s *Stack) BatchSize() int { return batchSize }

// Read implements tun.Device: it blocks until the stack sends packets and
// returns up to len(bufs) of them. After Close it returns os.ErrClosed.
func (s *Stack) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, ok := s.link.Read(s.ctx, bufs, sizes, offset)
	if !ok {
		return 0, os.ErrClosed
	}
	return n, nil
}

// Write implements tun.Device: it hands the packets from the gateway to
// the stack. The buffers are copied and not retained.
func (s *Stack) Write(bufs [][]byte, offset int) (int, error) {
	if s.ctx.Err() != nil {
		return 0, os.ErrClosed
	}
	s.link.Inject(bufs, offset, stacklink.AdmitIP)
	return len(bufs), nil
}

// Close implements tun.Device: it stops the stack; open connections fail.
func (s *Stack) Close() error {
	s.once.Do(func() {
		s.cancel()
		s.link.Close()
		s.ns.Close()
		s.ns.Wait()
		close(s.events)
	})
	return nil
}

// Has reports whether the stack has an address of family f.
func (s *Stack) Has(f *ipfamily.Family) bool { return s.addr[f.Index].IsValid() }

// ErrNoIPv6 is returned for IPv6 destinations when the lease has no IPv6
// address (errNoAddr for IPv4 ones without an IPv4 address); both wrap
// ENETUNREACH, as a kernel without a route of the family says.
var (
	ErrNoIPv6 = fmt.Errorf("the tunnel has no IPv6 address: %w", syscall.ENETUNREACH)
	errNoIPv4 = fmt.Errorf("the tunnel has no IPv4 address: %w", syscall.ENETUNREACH)
)

// addrOf returns the stack's address of family f, or an error wrapping
// ENETUNREACH.
func (s *Stack) addrOf(f *ipfamily.Family) (netip.Addr, error) {
	if a := s.addr[f.Index]; a.IsValid() {
		return a, nil
	}
	if f == ipfamily.V6 {
		return netip.Addr{}, ErrNoIPv6
	}
	return netip.Addr{}, errNoIPv4
}

// reachable checks that the stack has an address of dst's family.
func (s *Stack) reachable(dst netip.Addr) error {
	if _, err := s.addrOf(ipfamily.Of(dst)); err != nil {
		return fmt.Errorf("%v: %w", dst, err)
	}
	return nil
}

// DialTCP opens a TCP connection to dst through the tunnel.
func (s *Stack) DialTCP(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	if err := s.reachable(dst.Addr()); err != nil {
		return nil, err
	}
	return gonet.DialContextTCP(ctx, s.ns, full(dst), proto(dst.Addr().Unmap()))
}

// DialUDP opens a UDP socket connected to dst.
func (s *Stack) DialUDP(dst netip.AddrPort) (*gonet.UDPConn, error) {
	if err := s.reachable(dst.Addr()); err != nil {
		return nil, err
	}
	fa := full(dst)
	return gonet.DialUDP(s.ns, nil, &fa, proto(dst.Addr().Unmap()))
}

// ListenUDP opens an unconnected UDP socket on the tunnel address of
// family f.
func (s *Stack) ListenUDP(f *ipfamily.Family) (*gonet.UDPConn, error) {
	a, err := s.addrOf(f)
	if err != nil {
		return nil, err
	}
	la := full(netip.AddrPortFrom(a, 0))
	return gonet.DialUDP(s.ns, &la, nil, proto(a))
}

// ListenTCP listens on port of the tunnel address of family f (exposed
// ports reached over f).
func (s *Stack) ListenTCP(f *ipfamily.Family, port uint16) (*gonet.TCPListener, error) {
	a, err := s.addrOf(f)
	if err != nil {
		return nil, err
	}
	return gonet.ListenTCP(s.ns, full(netip.AddrPortFrom(a, port)), proto(a))
}

// LookupHost resolves name through the tunnel's DNS servers and returns
// its addresses in the order to try them. Without an IPv6 address: the A
// records, else the AAAA records. With one (dual stack, IPv6 first as
// RFC 6724 prefers): the AAAA records, then the A records. A name that
// does not exist gives a *net.DNSError with IsNotFound.
func (s *Stack) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	if len(s.cfg.DNS) == 0 {
		return nil, &net.DNSError{Err: "no DNS server in the lease", Name: name}
	}
	if !s.Has(ipfamily.V6) {
		addrs, err := s.lookup(ctx, name, dns.TypeA)
		var de *net.DNSError
		if len(addrs) > 0 || (errors.As(err, &de) && de.IsNotFound) {
			return addrs, err
		}
		if addrs6, err6 := s.lookup(ctx, name, dns.TypeAAAA); len(addrs6) > 0 || err6 != nil {
			return addrs6, err6
		}
		return nil, notFound(name, err)
	}
	// Dual stack: both questions at once, AAAA answers first.
	type answer struct {
		addrs []netip.Addr
		err   error
	}
	a6 := make(chan answer, 1)
	go func() {
		addrs, err := s.lookup(ctx, name, dns.TypeAAAA)
		a6 <- answer{addrs, err}
	}()
	addrs4, err4 := s.lookup(ctx, name, dns.TypeA)
	r6 := <-a6
	for _, err := range []error{r6.err, err4} {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, err
		}
	}
	if out := append(r6.addrs, addrs4...); len(out) > 0 {
		return out, nil
	}
	if r6.err != nil {
		return nil, r6.err
	}
	return nil, notFound(name, err4)
}

// notFound is err, or if nil the error of a name without addresses.
func notFound(name string, err error) error {
	if err != nil {
		return err
	}
	return &net.DNSError{Err: "no addresses", Name: name, IsNotFound: true}
}

// lookup asks the DNS servers in turn for name's records of qtype until
// one answers with addresses or says the name does not exist.
func (s *Stack) lookup(ctx context.Context, name string, qtype uint16) ([]netip.Addr, error) {
	var last error
	for _, srv := range s.cfg.DNS {
		addrs, err := s.query(ctx, netip.AddrPortFrom(srv, 53), name, qtype)
		if err == nil && len(addrs) > 0 {
			return addrs, nil
		}
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return nil, err
		}
		if err != nil {
			last = err
		}
	}
	return nil, last
}

// query asks srv one question over UDP (TCP when the answer is truncated).
func (s *Stack) query(ctx context.Context, srv netip.AddrPort, name string, qtype uint16) ([]netip.Addr, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	var resp *dns.Msg
	var err error
	for try := 0; try < dnsTries && resp == nil; try++ {
		resp, err = s.exchange(ctx, srv, m, false)
	}
	if err == nil && resp.Truncated {
		resp, err = s.exchange(ctx, srv, m, true)
	}
	if err != nil {
		return nil, &net.DNSError{Err: err.Error(), Name: name, Server: srv.String(), IsTimeout: true}
	}
	switch resp.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		return nil, &net.DNSError{Err: "no such host", Name: name, Server: srv.String(), IsNotFound: true}
	default:
		return nil, &net.DNSError{Err: dns.RcodeToString[resp.Rcode], Name: name, Server: srv.String(), IsTemporary: true}
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		switch r := rr.(type) {
		case *dns.A:
			if a, ok := netip.AddrFromSlice(r.A.To4()); ok {
				out = append(out, a)
			}
		case *dns.AAAA:
			if a, ok := netip.AddrFromSlice(r.AAAA.To16()); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

func (s *Stack) exchange(ctx context.Context, srv netip.AddrPort, m *dns.Msg, overTCP bool) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	var c net.Conn
	var err error
	if overTCP {
		c, err = s.DialTCP(ctx, srv)
	} else {
		c, err = s.DialUDP(srv)
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	dc := &dns.Conn{Conn: c}
	if err := dc.WriteMsg(m); err != nil {
		return nil, err
	}
	for {
		r, err := dc.ReadMsg()
		if err != nil {
			return nil, err
		}
		if r.Id == m.Id {
			return r, nil
		}
	}
}
