// SPDX-License-Identifier: MIT

package bypass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/proxy"
	"github.com/airlock-vpn/airlock/internal/stacklink"
)

// The divert stack: theory of operation.
//
// The packets the Device diverts are the job's own TCP and UDP flows to
// bypassed destinations, its echo requests to them (relayed through ping
// sockets, ping.go) and its DNS to its resolver's address. They are
// terminated in a gVisor netstack of the client's own (the divert stack),
// which has no address of the job's: its NIC is promiscuous and spoofing,
// so it accepts a flow to any destination and answers as that
// destination. gVisor's TCP and UDP forwarders hand each new flow to this
// file: a TCP flow's host socket is dialled through Engine.Dial first
// (entry, the gateway's policy, counters), and the job's handshake is
// completed only if that succeeded, else the job gets a reset; then the
// two are spliced with half-close (proxy.Splice). A UDP flow is relayed
// datagram by datagram until it is idle for udpIdle. DNS to the
// resolver's address on port 53 is answered here: local names by the
// site resolvers (from the node), other names over TCP by the gateway's
// resolver through the tunnel, as the job (Device.routeDNS).
//
// The stack is the client's, not the gateway's user-mode forwarder
// (internal/forward/netstack): the node carries none of the gateway's
// egress code. It shares the link endpoint and TCP tuning of both
// user-space stacks (internal/stacklink). It is started with the first
// diverted packet; a job that never reaches a bypassed destination costs
// nothing.

const (
	// divertQueue is how many packets for the job the divert stack
	// queues before it drops (TCP retransmits).
	divertQueue = 1024
	// maxInFlightSYN bounds the TCP flows being dialled at once.
	maxInFlightSYN = 256
	// udpIdle ends a UDP flow (and a DNS one) without traffic.
	udpIdle = 60 * time.Second
	// nicID is the divert stack's one NIC.
	nicID = 1
)

// divertStack terminates the job's diverted flows; see the theory of
// operation above. It is safe for concurrent use.
type divertStack struct {
	d      *Device
	ns     *stack.Stack
	link   *stacklink.Link
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // flows' goroutines
	ping   pinger

	// mu guards conns, the open flows' connections (the job's and the
	// host's), which close closes.
	mu     sync.Mutex
	conns  map[io.Closer]struct{}
	closed bool
}

// newDivertStack makes the stack for d; selves are the resolver's
// addresses (the gateway's tunnel addresses).
func newDivertStack(d *Device, selves []netip.Addr) (*divertStack, error) {
	ctx, cancel := context.WithCancel(context.Background())
	s := &divertStack{d: d, link: stacklink.New(uint32(d.mtu), divertQueue, nil), ctx: ctx, cancel: cancel, conns: map[io.Closer]struct{}{}}
	s.ping.s = s
	s.ns = stack.New(stacklink.StackOptions())
	if err := s.setup(selves); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *divertStack) setup(selves []netip.Addr) error {
	if err := stacklink.TuneTCP(s.ns); err != nil {
		return err
	}
	if err := s.ns.CreateNIC(nicID, s.link); err != nil {
		return fmt.Errorf("create nic: %s", err)
	}
	if err := s.ns.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("set nic promiscuous: %s", err)
	}
	if err := s.ns.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("set nic spoofing: %s", err)
	}
	for _, a := range selves {
		f := ipfamily.Of(a)
		pa := tcpip.ProtocolAddress{Protocol: networkProto[f.Index], AddressWithPrefix: tcpip.AddrFromSlice(a.AsSlice()).WithPrefix()}
		if err := s.ns.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("add address %s: %s", a, err)
		}
	}
	s.ns.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})
	tcpFwd := tcp.NewForwarder(s.ns, 0, maxInFlightSYN, s.handleTCP)
	s.ns.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	// Every datagram is the forwarder's (handled: true), relayed or
	// dropped, so the stack sends no ICMP port unreachable of its own.
	udpFwd := udp.NewForwarder(s.ns, func(r *udp.ForwarderRequest) bool { s.handleUDP(r); return true })
	s.ns.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	return nil
}

// write hands the job's diverted packets bufs[i][off:] to the stack
// (copied), and its echo requests to the pinger (ping.go). It reorders
// bufs.
func (s *divertStack) write(bufs [][]byte, off int) {
	k := 0
	for _, b := range bufs {
		if f, o, ok := echoRequest(b[off:]); ok {
			s.ping.echo(f, b[off:], o)
			continue
		}
		bufs[k] = b
		k++
	}
	if k > 0 {
		s.link.Inject(bufs[:k], off, stacklink.AdmitIP)
	}
}

// read blocks until the stack has packets for the job and moves up to
// len(bufs) of them into bufs[i][off:]; false after close.
func (s *divertStack) read(bufs [][]byte, sizes []int, off int) (int, bool) {
	return s.link.Read(s.ctx, bufs, sizes, off)
}

// flowAddrs returns a forwarded flow's job (source) and destination.
func flowAddrs(id stack.TransportEndpointID) (src, dst netip.AddrPort) {
	a, _ := netip.AddrFromSlice(id.RemoteAddress.AsSlice())
	b, _ := netip.AddrFromSlice(id.LocalAddress.AsSlice())
	return netip.AddrPortFrom(a.Unmap(), id.RemotePort), netip.AddrPortFrom(b.Unmap(), id.LocalPort)
}

// network returns "tcp4"/"udp4" or "tcp6"/"udp6" for base and dst.
func network(base string, dst netip.AddrPort) string {
	if dst.Addr().Is4() {
		return base + "4"
	}
	return base + "6"
}

// isResolver reports whether dst is the job's resolver's DNS port.
func (s *divertStack) isResolver(dst netip.AddrPort) bool {
	f := ipfamily.Of(dst.Addr())
	return f != nil && dst.Port() == 53 && dst.Addr() == s.d.dns[f.Index]
}

// track adds a flow's connections cs (nil ones skipped) to the open
// flows, or returns false if the stack is closed.
func (s *divertStack) track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	for _, c := range cs {
		if c != nil {
			s.conns[c] = struct{}{}
		}
	}
	s.wg.Add(1)
	return true
}

// enter counts a goroutine of the stack's (wg), or returns false if the
// stack is closed.
func (s *divertStack) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// untrack removes a flow's connections that track added.
func (s *divertStack) untrack(cs ...net.Conn) {
	s.mu.Lock()
	for _, c := range cs {
		if c != nil {
			delete(s.conns, c)
		}
	}
	s.mu.Unlock()
	s.wg.Done()
}

// handleTCP serves a new TCP flow of the job (in a goroutine of its own,
// gVisor's forwarder's).
func (s *divertStack) handleTCP(r *tcp.ForwarderRequest) {
	src, dst := flowAddrs(r.ID())
	var out net.Conn
	if !s.isResolver(dst) {
		ctx, cancel := context.WithTimeout(s.ctx, DialTimeout)
		c, err := s.d.eng.Dial(ctx, network("tcp", dst), dst)
		cancel()
		if err != nil {
			s.d.log.Debug("bypass: tcp flow refused", "src", src, "dst", dst, "err", err)
			r.Complete(true)
			return
		}
		out = c
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		if out != nil {
			out.Close()
		}
		return
	}
	r.Complete(false)
	job := gonet.NewTCPConn(&wq, ep)
	if !s.track(job, out) {
		job.Close()
		if out != nil {
			out.Close()
		}
		return
	}
	defer s.untrack(job, out)
	if out == nil {
		s.serveDNSTCP(job)
		return
	}
	proxy.Splice(job, out)
}

// serveDNSTCP answers the DNS over TCP connection c to the job's
// resolver until the job closes it or it is idle for udpIdle.
func (s *divertStack) serveDNSTCP(c net.Conn) {
	defer c.Close()
	conn := &dns.Conn{Conn: c}
	for {
		c.SetReadDeadline(time.Now().Add(udpIdle))
		req, err := conn.ReadMsg()
		if err != nil {
			return
		}
		if err := conn.WriteMsg(s.answer(req, "tcp")); err != nil {
			return
		}
	}
}

// answer returns the answer to the job's query req (which arrived over
// network "udp" or "tcp"): local names from the site resolvers, other
// names over TCP from the gateway's resolver (Device.routeDNS), SERVFAIL
// if none answers.
func (s *divertStack) answer(req *dns.Msg, network string) *dns.Msg {
	ctx, cancel := context.WithTimeout(s.ctx, DialTimeout)
	defer cancel()
	var resp *dns.Msg
	var err error
	if len(req.Question) == 1 && s.d.eng.Set().IsLocal(req.Question[0].Name) {
		resp, err = s.d.eng.exchangeSite(ctx, req, network)
	} else if r, handled, rerr := s.d.routeDNS(ctx, req, network); handled {
		resp, err = r, rerr
	} else {
		err = errors.New("not a local name")
	}
	if err != nil || resp == nil {
		s.d.log.Debug("bypass: dns query failed", "err", err)
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		return m
	}
	resp.Id = req.Id
	return resp
}

// handleUDP serves a new UDP flow of the job.
func (s *divertStack) handleUDP(r *udp.ForwarderRequest) {
	src, dst := flowAddrs(r.ID())
	var out net.Conn
	if !s.isResolver(dst) {
		ctx, cancel := context.WithTimeout(s.ctx, DialTimeout)
		c, err := s.d.eng.Dial(ctx, network("udp", dst), dst)
		cancel()
		if err != nil {
			s.d.log.Debug("bypass: udp flow refused", "src", src, "dst", dst, "err", err)
			return
		}
		out = c
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		if out != nil {
			out.Close()
		}
		return
	}
	job := gonet.NewUDPConn(&wq, ep)
	if !s.track(job, out) {
		job.Close()
		if out != nil {
			out.Close()
		}
		return
	}
	go func() {
		defer s.untrack(job, out)
		if out == nil {
			s.serveDNSUDP(job)
			return
		}
		relayUDP(job, out)
	}()
}

// serveDNSUDP answers the job's queries on the UDP flow c to its
// resolver until it is idle for udpIdle.
func (s *divertStack) serveDNSUDP(c net.Conn) {
	defer c.Close()
	buf := make([]byte, dns.MaxMsgSize)
	for {
		c.SetReadDeadline(time.Now().Add(udpIdle))
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		req := new(dns.Msg)
		if req.Unpack(buf[:n]) != nil {
			continue
		}
		resp := s.answer(req, "udp")
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		resp.Truncate(size)
		if b, err := resp.Pack(); err == nil {
			c.Write(b)
		}
	}
}

// relayUDP copies datagrams both ways between the job's flow and its host
// socket until neither has seen traffic for udpIdle, then closes both.
func relayUDP(job, out net.Conn) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	wg.Add(2)
	pump := func(dst, src net.Conn) {
		defer wg.Done()
		defer job.Close()
		defer out.Close()
		buf := make([]byte, 65535)
		for {
			src.SetReadDeadline(time.Unix(0, last.Load()).Add(udpIdle))
			n, err := src.Read(buf)
			if err != nil {
				var ne net.Error
				switch {
				case errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < udpIdle:
					continue
				case errors.Is(err, syscall.ECONNREFUSED):
					continue
				}
				return
			}
			last.Store(time.Now().UnixNano())
			dst.Write(buf[:n]) // a lost datagram is UDP's
		}
	}
	go pump(out, job)
	go pump(job, out)
	wg.Wait()
}

// close stops the stack: open flows end.
func (s *divertStack) close() {
	s.cancel()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ping.close()
	s.link.Close()
	s.ns.Close()
	s.ns.Wait()
	s.wg.Wait()
}

// exchangeSite asks the site resolvers req over network ("udp" or
// "tcp"), in turn, from the node.
func (e *Engine) exchangeSite(ctx context.Context, req *dns.Msg, network string) (*dns.Msg, error) {
	c := &dns.Client{Net: network, Dialer: &e.dialer}
	var last error = errors.New("no site resolver")
	for _, r := range e.Set().Resolvers() {
		resp, _, err := c.ExchangeContext(ctx, req, r.String())
		if err == nil {
			return resp, nil
		}
		last = err
	}
	return nil, fmt.Errorf("site resolvers: %w", last)
}
