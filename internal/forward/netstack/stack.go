// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/time/rate"
	"golang.zx2c4.com/wireguard/tun"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/fdlimit"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/stacklink"
)

const (
	nicID = 1

	// queueLen is the link endpoint's outbound queue, in packets (a GSO
	// segment of up to 64 KiB counts as one). When it is full the
	// netstack drops and TCP retransmits.
	queueLen = 1024

	// batchSize is the most packets Read returns and Write is offered.
	batchSize = 64

	// flowLogRate and flowLogBurst limit per-flow Debug logs.
	flowLogRate  = 20 // per second
	flowLogBurst = 50
)

var _ forward.Backend = (*Stack)(nil)

// Counters are a Stack's cumulative counters of its own, beyond the
// contract's Stats.
type Counters struct {
	TCPFlows     uint64 // TCP flows forwarded (dial succeeded, handshake done)
	UDPFlows     uint64 // UDP flows opened
	DialFailures uint64 // host dials that failed (TCP: the job got a RST; UDP: flow dropped)
	NoFiles      uint64 // of those, failed for lack of file descriptors (EMFILE, ENFILE)
	Denied       uint64 // refused by the floor or the policy: TCP SYNs, UDP datagrams
	DNSQueries   uint64 // queries received by the DNS server
	DNSFailures  uint64 // queries answered with SERVFAIL
	Dropped      uint64 // packets dropped at Read/Write (malformed, oversized, filtered)
	// BlockExhausted counts flows refused because the job's port block had
	// no free port towards the destination.
	BlockExhausted uint64
	// KernelTCPFlows counts the TCPFlows whose job side the kernel
	// terminated (Config.KernelTCP).
	KernelTCPFlows uint64
}

// counters are the atomic backing of Counters.
type counters struct {
	tcpFlows, udpFlows, dialFailures, denied atomic.Uint64
	dnsQueries, dnsFailures, dropped         atomic.Uint64
	blockExhausted, kernelTCPFlows           atomic.Uint64
	noFiles                                  atomic.Uint64
}

// Stack is the user-mode egress: a gVisor netstack that is also the
// WireGuard device's tun.Device. Create it with New. All methods are safe
// for concurrent use; the zero value is not usable.
type Stack struct {
	cfg Config
	log *slog.Logger
	// self are the gateway's tunnel addresses by family (zero length:
	// none of the family), egress the host addresses jobs' flows leave
	// from by family (Config.Egress).
	self    [ipfamily.N]tcpip.Address
	egress  [ipfamily.N]netip.Addr
	ep      *stacklink.Link
	admit   func([]byte) (tcpip.NetworkProtocolNumber, bool) // s.admitPacket, bound once
	ns      *stack.Stack
	events  chan tun.Event
	flowLog *rate.Limiter
	// noFiles warns of dials and accepts that found no free file
	// descriptor (noteNoFiles).
	noFiles *fdlimit.Warner
	stats   counters
	dns     [ipfamily.N]*dnsfwd.Server // on each tunnel address, by family
	// dnsLimits are the jobs' DNS limits, shared by the relays of both
	// families: one budget per job.
	dnsLimits dnsfwd.Limiter
	host      hostAddrs
	// reg is the job bookkeeping every backend shares (AddJob,
	// RemoveJob, the job index); jobs the Stack's own state of each job
	// (jobs.go).
	reg     *forward.Jobs
	jobs    jobTable
	limits  limitTable   // the global limits and the limits' counters (limits.go)
	pings   *pingTable   // jobs' ICMP echo flows (ping.go)
	exposed *exposeTable // jobs' inbound exposures (expose.go)
	pol     policyState  // egress policy, drop counters (policy.go)
	denied  sync.Map     // policy rule → its flows.Denied verdict (flows.go)
	ktcp    *kernelTCP   // nil unless Config.KernelTCP (kerneltcp_linux.go)

	// ctx is cancelled by Close; it bounds dials, DNS exchanges and Read.
	ctx    context.Context
	cancel context.CancelFunc

	// closing is set at the start of Close; Write checks it.
	closing atomic.Bool

	// wg counts the goroutines the Stack runs or adopts (flow relays, TCP
	// handlers, DNS). Add is only called with mu held and closed false, so
	// no Add races with Close's Wait.
	wg sync.WaitGroup

	// mu guards closed and flows, the open per-flow closers Close shuts
	// down. It is never held while calling into the netstack.
	mu     sync.Mutex
	closed bool
	flows  map[io.Closer]struct{}

	closeOnce sync.Once
}

// New builds the netstack, starts its DNS server and forwarders, and returns
// it ready to be used as the WireGuard device's tun.Device.
func New(cfg Config) (*Stack, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		if cfg.KernelTCP != nil {
			cfg.KernelTCP.Close()
		}
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stack{
		cfg:     cfg,
		log:     cfg.Logger,
		events:  make(chan tun.Event, 1),
		flowLog: rate.NewLimiter(flowLogRate, flowLogBurst),
		noFiles: fdlimit.NewWarner(cfg.Logger),
		ctx:     ctx,
		cancel:  cancel,
		flows:   make(map[io.Closer]struct{}),
		host:    hostAddrs{list: cfg.HostAddrs, local: cfg.LocalRoutes},
	}
	for _, p := range cfg.Addrs {
		s.self[ipfamily.Of(p.Addr()).Index] = tcpip.AddrFromSlice(p.Addr().AsSlice())
	}
	for _, a := range cfg.Egress {
		s.egress[ipfamily.Of(a).Index] = a
	}
	if err := s.newJobs(); err != nil {
		cancel()
		if cfg.KernelTCP != nil {
			cfg.KernelTCP.Close()
		}
		return nil, fmt.Errorf("netstack config: %w", err)
	}
	s.ep = stacklink.New(uint32(cfg.MTU), queueLen, func() { s.stats.dropped.Add(1) })
	s.admit = s.admitPacket
	if cfg.KernelTCP != nil {
		if s.ktcp, err = newKernelTCP(s, cfg.KernelTCP); err != nil {
			cancel()
			cfg.KernelTCP.Close()
			return nil, err
		}
		s.ep.SetNotify(s.ktcp.notify)
	}
	s.ns = stack.New(stacklink.StackOptions())
	if err := s.setupStack(); err != nil {
		s.closeKernelTCP()
		cancel()
		s.ns.Close()
		s.ns.Wait()
		return nil, err
	}
	for _, p := range cfg.Addrs {
		d, err := startDNS(s, p.Addr())
		if err != nil {
			s.closeDNS()
			s.closeKernelTCP()
			cancel()
			s.ns.Close()
			s.ns.Wait()
			return nil, err
		}
		s.dns[ipfamily.Of(p.Addr()).Index] = d
	}
	s.pings = newPingTable(s)
	s.exposed = newExposeTable()
	s.track(s.pings)
	s.track(s.exposed)
	logPingAvailability(s.log, s.pings.listen)
	if s.ktcp != nil {
		s.ktcp.start()
	}
	s.events <- tun.EventUp
	s.log.Info("netstack egress started", "tcp", s.tcpStackName(), "addrs", cfg.Addrs, "mtu", cfg.MTU,
		"dns_upstreams", cfg.DNSUpstreams)
	return s, nil
}

// setupStack configures protocols, the NIC, its address, routes and the
// TCP and UDP forwarders.
func (s *Stack) setupStack() error {
	if err := stacklink.TuneTCP(s.ns); err != nil {
		return err
	}

	if err := s.ns.CreateNIC(nicID, s.ep); err != nil {
		return tcpipError("create nic", err)
	}
	if err := s.ns.SetPromiscuousMode(nicID, true); err != nil {
		return tcpipError("set nic promiscuous", err)
	}
	if err := s.ns.SetSpoofing(nicID, true); err != nil {
		return tcpipError("set nic spoofing", err)
	}
	for _, p := range s.cfg.Addrs {
		pa := tcpip.ProtocolAddress{
			Protocol:          protoOf(p.Addr()),
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(p.Addr().AsSlice()), PrefixLen: p.Bits()},
		}
		if err := s.ns.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return tcpipError(fmt.Sprintf("add address %s", p), err)
		}
	}
	s.ns.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})

	tcpFwd := tcp.NewForwarder(s.ns, 0, s.cfg.MaxInFlightSYN, s.handleTCP)
	s.ns.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	// Every datagram is the forwarder's, relayed or dropped (handled:
	// true), so the stack sends no ICMP port unreachable for a denied one.
	udpFwd := udp.NewForwarder(s.ns, func(r *udp.ForwarderRequest) bool { s.handleUDP(r); return true })
	s.ns.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	return nil
}

// protoOf returns the network protocol number for a.
func protoOf(a netip.Addr) tcpip.NetworkProtocolNumber {
	if a.Is4() {
		return ipv4.ProtocolNumber
	}
	return ipv6.ProtocolNumber
}

// File implements tun.Device; there is no file.
func (s *Stack) File() *os.File { return nil }

// Name implements tun.Device.
func (s *Stack) Name() (string, error) { return "airlock-netstack", nil }

// MTU implements tun.Device.
func (s *Stack) MTU() (int, error) { return s.cfg.MTU, nil }

// Events implements tun.Device: EventUp once, closed by Close.
func (s *Stack) Events() <-chan tun.Event { return s.events }

// BatchSize implements tun.Device.
func (s *Stack) BatchSize() int {
	if s.ktcp != nil {
		return max(batchSize, s.ktcp.dev.BatchSize())
	}
	return batchSize
}

// Queues implements forward.Backend: one reader per queue of the private
// namespace's TUN with the kernel's TCP, else one (the netstack's queue
// has one reader at a time).
func (s *Stack) Queues() int {
	if s.ktcp != nil {
		return s.ktcp.dev.Queues()
	}
	return 1
}

// tcpStackName names the stack that terminates jobs' TCP.
func (s *Stack) tcpStackName() string {
	if s.ktcp != nil {
		return "kernel (IPv4), netstack (IPv6)"
	}
	return "netstack"
}

// closeKernelTCP closes the kernel TCP path, if any.
func (s *Stack) closeKernelTCP() {
	if s.ktcp != nil {
		s.ktcp.close()
	}
}

// Write implements tun.Device: it injects the IPv4/IPv6 packets
// bufs[i][offset:] sent by jobs into the netstack. The buffers are copied
// and not retained. Packets that are not IP are dropped and counted; ICMP
// echo requests for destinations other than the tunnel address go to the
// ping relay (ping.go) instead of the netstack.
// Write never fails for a bad packet; after Close it returns os.ErrClosed.
func (s *Stack) Write(bufs [][]byte, offset int) (int, error) {
	if s.closing.Load() {
		return 0, os.ErrClosed
	}
	if s.ktcp != nil {
		s.ktcp.write(bufs, offset)
		return len(bufs), nil
	}
	if refused := s.ep.Inject(bufs, offset, s.admit); refused > 0 {
		s.stats.dropped.Add(uint64(refused))
	}
	return len(bufs), nil
}

// admitPacket returns the network protocol of pkt and whether it may enter
// the netstack: ICMP echo requests for destinations other than the tunnel
// addresses go to the ping relay (ping.go) instead, since the netstack
// would answer them itself; malformed ICMP for them is refused.
func (s *Stack) admitPacket(pkt []byte) (tcpip.NetworkProtocolNumber, bool) {
	f := ipfamily.OfPacket(pkt)
	if f == nil || len(pkt) < f.HeaderLen {
		return 0, false
	}
	proto := networkProto[f.Index]
	if pkt[f.ProtoOff] != f.ICMP || s.isSelf(f, pkt[f.DstOff:f.DstOff+f.Bits/8]) {
		return proto, true
	}
	off, _, ok := f.PayloadOffset(pkt)
	end := packetEnd(f, pkt)
	if !ok || end > len(pkt) || end <= off || f == ipfamily.V4 && header.IPv4(pkt).More() {
		return 0, false // fragments, runts: nothing to relay
	}
	if pkt[off] != f.EchoRequest {
		return proto, true
	}
	s.pings.relay(f, pkt[:end], off)
	return proto, false // taken over, counted by relay
}

// networkProto are gVisor's network protocol numbers by family.
var networkProto = [ipfamily.N]tcpip.NetworkProtocolNumber{ipv4.ProtocolNumber, ipv6.ProtocolNumber}

// packetEnd returns where the IP packet pkt of family f ends, by its
// header's length field.
func packetEnd(f *ipfamily.Family, pkt []byte) int {
	if f == ipfamily.V4 {
		return int(header.IPv4(pkt).TotalLength())
	}
	return f.HeaderLen + int(header.IPv6(pkt).PayloadLength())
}

// isSelf reports whether the address bytes a of family f are the gateway's
// tunnel address of f.
func (s *Stack) isSelf(f *ipfamily.Family, a []byte) bool {
	self := s.self[f.Index]
	return self.Len() == len(a) && self == tcpip.AddrFromSlice(a)
}

// Read implements tun.Device: it blocks until the netstack has at least one
// packet for jobs, then writes up to len(bufs) IP packets into
// bufs[i][offset:], setting sizes[i]. The netstack's large TCP segments
// (GSO) are split here into packets of at most the MTU, with complete
// checksums; one segment may span several Reads. Packets that do not fit
// their buffer are dropped and counted. After Close, pending and future
// calls return os.ErrClosed.
func (s *Stack) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if s.ktcp != nil {
		return s.ktcp.read(bufs, sizes, offset)
	}
	n, ok := s.ep.Read(s.ctx, bufs, sizes, offset)
	if !ok {
		return 0, os.ErrClosed
	}
	return n, nil
}

// Counters returns a snapshot of the counters.
func (s *Stack) Counters() Counters {
	return Counters{
		TCPFlows:     s.stats.tcpFlows.Load(),
		UDPFlows:     s.stats.udpFlows.Load(),
		DialFailures: s.stats.dialFailures.Load(),
		NoFiles:      s.stats.noFiles.Load(),
		Denied:       s.stats.denied.Load(),
		DNSQueries:   s.stats.dnsQueries.Load(),
		DNSFailures:  s.stats.dnsFailures.Load(),
		Dropped:      s.stats.dropped.Load(),

		BlockExhausted: s.stats.blockExhausted.Load(),
		KernelTCPFlows: s.stats.kernelTCPFlows.Load(),
	}
}

// Close stops the Stack: pending Read calls return os.ErrClosed, the DNS
// server stops, every flow is closed, and the netstack is torn down. It
// waits for the Stack's goroutines to exit. Close is idempotent.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		s.cancel()
		s.closeDNS()
		s.closeKernelTCP()

		s.mu.Lock()
		s.closed = true
		flows := s.flows
		s.flows = nil
		s.mu.Unlock()
		for c := range flows {
			c.Close()
		}
		s.wg.Wait()

		s.ns.Close()
		s.ep.Close()
		s.ns.Wait()
		close(s.events)
		st := s.Counters()
		s.log.Info("netstack egress stopped", "tcp_flows", st.TCPFlows, "udp_flows", st.UDPFlows,
			"dial_failures", st.DialFailures, "denied", st.Denied)
	})
	return nil
}

// closeDNS closes the DNS servers; they wait out their queries in
// parallel.
func (s *Stack) closeDNS() {
	var wg sync.WaitGroup
	for _, d := range s.dns {
		if d != nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.Close()
			}()
		}
	}
	wg.Wait()
}

// enter registers a goroutine with the Stack (the caller must call
// s.wg.Done when it finishes) unless the Stack is closing; it reports
// whether it did.
func (s *Stack) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

// goStart runs f in a goroutine registered with the Stack, unless the Stack
// is closing; it reports whether f was started.
func (s *Stack) goStart(f func()) bool {
	if !s.enter() {
		return false
	}
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// track registers c to be closed by Close. If the Stack is already closing
// it closes c and returns false. untrack removes c.
func (s *Stack) track(c io.Closer) bool {
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.flows[c] = struct{}{}
	}
	s.mu.Unlock()
	if closed {
		c.Close()
		return false
	}
	return true
}

func (s *Stack) untrack(c io.Closer) {
	s.mu.Lock()
	delete(s.flows, c)
	s.mu.Unlock()
}

// flowDebugOn reports whether a per-flow Debug log may be written now; it
// consumes rate-limiter budget only when Debug is enabled. Callers build
// attributes only after it returns true.
func (s *Stack) flowDebugOn() bool {
	return s.log.Enabled(context.Background(), slog.LevelDebug) && s.flowLog.Allow()
}
