// SPDX-License-Identifier: MIT

package netstack

// ICMP echo ("ping") from jobs to outside hosts, in user mode.
//
// Theory of operation: gVisor has no ICMP forwarder, so echo requests for
// destinations other than the tunnel address never enter the netstack
// (echo to the tunnel address itself is answered by the netstack's IPv4
// layer). Stack.Write's admit path hands them to pingTable.relay instead,
// which checks the destination like a TCP or UDP flow (checkFlow)
// and sends the ICMP message through an unprivileged ICMP "ping" socket of
// the gateway host (socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)). Linux
// allows those only to users whose group is inside
// net.ipv4.ping_group_range; New probes once and logs a Warn line naming
// the sysctl when they are not allowed, and echo requests are then dropped
// and counted.
//
// The kernel rewrites the echo identifier of everything sent on a ping
// socket to the socket's own identifier (its "port") and delivers to the
// socket only the replies that carry it. So there is one socket per job
// echo flow, keyed by (job address, job's echo id); the socket's reader
// goroutine knows whose replies it receives, rebuilds each one as an IPv4
// echo reply packet from the outside host to the job with the job's own
// id, sequence number and payload, and queues it on the link endpoint for
// Read. A flow is closed after pingIdleTimeout without a request or reply,
// by RemoveJob for the job's flows, and by Close. A job has at most
// maxPingFlowsPerJob flows at once; requests for further ids are dropped.
//
// ICMPv6 echo works the same way (relay6): the job's echo request (an
// IPv6 packet whose next header is ICMPv6, no extension headers) goes out
// of an ICMPv6 ping socket (socket(AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6),
// governed by the same sysctl), and each reply is rebuilt as an IPv6
// packet with the ICMPv6 checksum over the pseudo-header. The flows of
// both families share the per-job cap.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/policy"
)

const (
	// pingIdleTimeout closes a job's echo flow after no request or reply
	// for this long.
	pingIdleTimeout = 30 * time.Second
	// maxPingFlowsPerJob caps a job's echo flows (distinct echo ids) at
	// once.
	maxPingFlowsPerJob = 16
	// pingTTL is the TTL of the echo replies the gateway builds.
	pingTTL = 64
)

// PingSysctlHint is the command that lets every group use ping sockets.
const PingSysctlHint = `sysctl -w net.ipv4.ping_group_range="0 2147483647"`

// listenPingHost opens a host ICMPv4 ping socket, bound to addr if valid.
func listenPingHost(addr netip.Addr) (net.PacketConn, error) {
	host := "0.0.0.0"
	if addr.IsValid() && addr.Unmap().Is4() {
		host = addr.Unmap().String()
	}
	c, err := icmp.ListenPacket("udp4", host)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// listenPing6Host opens a host ICMPv6 ping socket, bound to addr if it is
// an IPv6 address — with IPV6_FREEBIND, so that a job's own address
// (--egress-prefix6, received through a local route, on no interface)
// can be bound as its TCP and UDP sockets are.
func listenPing6Host(addr netip.Addr) (net.PacketConn, error) {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	sa := &unix.SockaddrInet6{}
	if addr.IsValid() && addr.Is6() && !addr.Is4In6() {
		sa.Addr = addr.As16()
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1); err != nil {
			unix.Close(fd)
			return nil, os.NewSyscallError("setsockopt IPV6_FREEBIND", err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	// As golang.org/x/net/icmp does: the net package takes a datagram
	// socket of any protocol as a UDPConn (WriteTo and ReadFrom with
	// *net.UDPAddr, deadlines).
	f := os.NewFile(uintptr(fd), "icmpv6-ping")
	defer f.Close()
	c, err := net.FilePacketConn(f)
	if err != nil {
		return nil, fmt.Errorf("ping socket: %w", err)
	}
	return c, nil
}

// checkPing opens and closes one socket with listen and returns nil if
// that works, else an error that says how to enable ping sockets.
func checkPing(listen func() (net.PacketConn, error)) error {
	c, err := listen()
	if err == nil {
		c.Close()
		return nil
	}
	if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("ping sockets not allowed for the gateway's group %d (net.ipv4.ping_group_range excludes it); to enable ping from jobs run, as root in the gateway's network namespace: %s: %w",
			syscall.Getgid(), PingSysctlHint, err)
	}
	return fmt.Errorf("open ping socket: %w", err)
}

// pingKey names one job echo flow: the job's address it comes from (IPv4
// or IPv6) and its echo id.
type pingKey struct {
	job netip.Addr
	id  uint16
}

// pingFlow is one job echo flow and its host socket.
type pingFlow struct {
	key   pingKey
	owner netip.Addr // the address that names the job (jobOf: IPv4 for a dual-stack job)
	conn  net.PacketConn
	fl    *flows.Flow  // nil without a flow table
	last  atomic.Int64 // unix nanoseconds of the last request or reply
}

// pingTable holds a Stack's echo flows. It is safe for concurrent use; it
// is registered with the Stack through track, so Stack.Close closes it.
type pingTable struct {
	s       *Stack
	listen  func() (net.PacketConn, error) // ICMPv4 sockets
	listen6 func() (net.PacketConn, error) // ICMPv6 sockets

	mu     sync.Mutex
	closed bool
	flows  map[pingKey]*pingFlow
	perJob map[netip.Addr]int // by owner: both families of a job share the cap
}

func newPingTable(s *Stack) *pingTable {
	listen := s.cfg.ListenPing
	if listen == nil {
		egress := s.cfg.EgressAddr
		listen = func() (net.PacketConn, error) { return listenPingHost(egress) }
	}
	listen6 := s.cfg.ListenPing6
	if listen6 == nil {
		egress := s.cfg.EgressAddr
		listen6 = func() (net.PacketConn, error) { return listenPing6Host(egress) }
	}
	return &pingTable{s: s, listen: listen, listen6: listen6, flows: make(map[pingKey]*pingFlow), perJob: make(map[netip.Addr]int)}
}

// relay sends the job's IPv4 ICMP echo request pkt (IPv4 header of ihl
// bytes, then the ICMP message) to its destination, creating the flow's
// socket on first use. It runs on the Write path: it never blocks on the
// network and copies nothing it keeps. Denied requests are counted in
// Denied, others that cannot be sent in Dropped.
func (t *pingTable) relay(pkt []byte, ihl int) {
	s := t.s
	h := header.IPv4(pkt)
	msg := pkt[ihl:int(h.TotalLength())]
	if len(msg) < header.ICMPv4MinimumSize || header.ICMPv4(msg).Code() != 0 {
		s.stats.dropped.Add(1)
		return
	}
	srcA, dstA := h.SourceAddress().As4(), h.DestinationAddress().As4()
	src, dst := netip.AddrFrom4(srcA), netip.AddrFrom4(dstA)
	if err := s.checkFlow(netip.AddrPortFrom(src, header.ICMPv4(msg).Ident()), policy.ProtoICMP, netip.AddrPortFrom(dst, 0)); err != nil {
		s.stats.denied.Add(1)
		if s.flowDebugOn() {
			s.log.Debug("icmp echo denied", "src", src, "dst", dst, "err", err)
		}
		return
	}
	t.send(pingKey{job: src, id: header.ICMPv4(msg).Ident()}, dst, msg)
}

// relay6 is relay for the job's IPv6 packet pkt carrying an ICMPv6 echo
// request right after the fixed header. Packets with extension headers
// (fragments among them) are dropped and counted.
func (t *pingTable) relay6(pkt []byte) {
	s := t.s
	h := header.IPv6(pkt)
	end := header.IPv6MinimumSize + int(h.PayloadLength())
	if h.NextHeader() != uint8(header.ICMPv6ProtocolNumber) || end > len(pkt) {
		s.stats.dropped.Add(1)
		return
	}
	msg := header.ICMPv6(pkt[header.IPv6MinimumSize:end])
	if len(msg) < header.ICMPv6EchoMinimumSize || msg.Type() != header.ICMPv6EchoRequest || msg.Code() != 0 {
		s.stats.dropped.Add(1)
		return
	}
	src, dst := netip.AddrFrom16(h.SourceAddress().As16()), netip.AddrFrom16(h.DestinationAddress().As16())
	if err := s.checkFlow(netip.AddrPortFrom(src, msg.Ident()), policy.ProtoICMP, netip.AddrPortFrom(dst, 0)); err != nil {
		s.stats.denied.Add(1)
		if s.flowDebugOn() {
			s.log.Debug("icmpv6 echo denied", "src", src, "dst", dst, "err", err)
		}
		return
	}
	t.send(pingKey{job: src, id: msg.Ident()}, dst, msg)
}

// send sends the echo request msg (ICMP header onwards) of flow k to dst.
func (t *pingTable) send(k pingKey, dst netip.Addr, msg []byte) {
	s := t.s
	src := k.job
	f := t.flow(k, dst)
	if f == nil {
		s.stats.dropped.Add(1)
		return
	}
	f.last.Store(time.Now().UnixNano())
	if _, err := f.conn.WriteTo(msg, &net.UDPAddr{IP: dst.AsSlice()}); err != nil {
		s.stats.dropped.Add(1)
		if s.flowDebugOn() {
			s.log.Debug("icmp echo send failed", "src", src, "dst", dst, "err", err)
		}
	} else {
		f.fl.AddOut(uint64(len(msg)), 1)
	}
}

// flow returns the flow of k, opening its socket and starting its reader;
// nil if the job has too many flows or the socket cannot be opened. dst is
// the first request's destination, recorded in the flow table.
func (t *pingTable) flow(k pingKey, dst netip.Addr) *pingFlow {
	owner := t.s.jobOf(k.job)
	t.mu.Lock()
	f, ok := t.flows[k]
	full := t.perJob[owner] >= maxPingFlowsPerJob
	closed := t.closed
	t.mu.Unlock()
	if ok {
		return f
	}
	if full || closed {
		return nil
	}
	listen := t.listen
	if k.job.Is6() {
		listen = t.listen6
		if t.s.cfg.ListenPing6 == nil {
			// A job with its own IPv6 egress address (--egress-prefix6)
			// pings from it, as its TCP and UDP flows leave from it.
			if je, ok := t.s.jobs.lookup(k.job); ok && je.addr.Is6() {
				listen = func() (net.PacketConn, error) { return listenPing6Host(je.addr) }
			}
		}
	}
	c, err := listen()
	if err != nil {
		if t.s.flowLog.Allow() {
			t.s.log.Warn("icmp echo from job dropped: cannot open ping socket", "job", k.job, "err", err)
		}
		return nil
	}
	f = &pingFlow{key: k, owner: owner, conn: c}
	f.last.Store(time.Now().UnixNano())
	t.mu.Lock()
	if old, ok := t.flows[k]; ok || t.closed || t.perJob[owner] >= maxPingFlowsPerJob {
		t.mu.Unlock()
		c.Close()
		return old // nil unless another Write raced us to it
	}
	t.flows[k] = f
	t.perJob[owner]++
	t.mu.Unlock()
	f.fl = t.s.openFlow(flows.ProtoICMP, netip.AddrPortFrom(k.job, k.id), netip.AddrPortFrom(dst, 0), flows.Egress)
	if f.fl != nil {
		f.fl.SetCloser(c)
	}
	if !t.s.goStart(func() { t.receive(f) }) {
		t.drop(f)
		return nil
	}
	if t.s.flowDebugOn() {
		t.s.log.Debug("icmp echo flow opened", "job", k.job, "id", k.id, "local", c.LocalAddr())
	}
	return f
}

// receive delivers the echo replies of f to its job until f is idle for
// pingIdleTimeout or closed.
func (t *pingTable) receive(f *pingFlow) {
	defer t.drop(f)
	var buf [1 << 16]byte
	v6 := f.key.job.Is6()
	hdr := header.IPv4MinimumSize
	if v6 {
		hdr = header.IPv6MinimumSize
	}
	for {
		_ = f.conn.SetReadDeadline(time.Now().Add(pingIdleTimeout))
		n, from, err := f.conn.ReadFrom(buf[hdr:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, f.last.Load())) < pingIdleTimeout {
				continue
			}
			return
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok {
			continue
		}
		peer, ok := netip.AddrFromSlice(ua.IP)
		if !ok {
			continue
		}
		var pkt []byte
		switch {
		case !v6 && peer.Unmap().Is4():
			msg := header.ICMPv4(buf[hdr : hdr+n])
			if n < header.ICMPv4MinimumSize || msg.Type() != header.ICMPv4EchoReply {
				continue
			}
			pkt = buildEchoReply(buf[:hdr+n], peer.Unmap().As4(), f.key.job.As4(), f.key.id)
		case v6 && peer.Is6() && !peer.Is4In6():
			msg := header.ICMPv6(buf[hdr : hdr+n])
			if n < header.ICMPv6EchoMinimumSize || msg.Type() != header.ICMPv6EchoReply {
				continue
			}
			pkt = buildEchoReply6(buf[:hdr+n], peer.As16(), f.key.job.As16(), f.key.id)
		default:
			continue
		}
		f.last.Store(time.Now().UnixNano())
		if !t.s.ep.Deliver(pkt) {
			t.s.stats.dropped.Add(1)
		} else {
			f.fl.AddIn(uint64(n), 1)
		}
	}
}

// buildEchoReply completes p = room for an IPv4 header | ICMP echo reply
// as an IPv4 packet from src to dst with echo id, and returns it.
func buildEchoReply(p []byte, src, dst [4]byte, id uint16) []byte {
	msg := header.ICMPv4(p[header.IPv4MinimumSize:])
	msg.SetIdent(id)
	msg.SetChecksum(0)
	msg.SetChecksum(^checksum.Checksum(msg, 0))
	ip := header.IPv4(p)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(p)),
		Flags:       header.IPv4FlagDontFragment,
		TTL:         pingTTL,
		Protocol:    uint8(header.ICMPv4ProtocolNumber),
		SrcAddr:     tcpip.AddrFrom4(src),
		DstAddr:     tcpip.AddrFrom4(dst),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	return p
}

// buildEchoReply6 completes p = room for an IPv6 header | ICMPv6 echo
// reply as an IPv6 packet from src to dst with echo id, and returns it.
func buildEchoReply6(p []byte, src, dst [16]byte, id uint16) []byte {
	msg := header.ICMPv6(p[header.IPv6MinimumSize:])
	msg.SetIdent(id)
	msg.SetChecksum(0)
	msg.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{
		Header: msg,
		Src:    tcpip.AddrFrom16(src),
		Dst:    tcpip.AddrFrom16(dst),
	}))
	header.IPv6(p).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(len(msg)),
		TransportProtocol: header.ICMPv6ProtocolNumber,
		HopLimit:          pingTTL,
		SrcAddr:           tcpip.AddrFrom16(src),
		DstAddr:           tcpip.AddrFrom16(dst),
	})
	return p
}

// drop closes f and forgets it.
func (t *pingTable) drop(f *pingFlow) {
	t.mu.Lock()
	if t.flows[f.key] == f {
		delete(t.flows, f.key)
		if t.perJob[f.owner]--; t.perJob[f.owner] <= 0 {
			delete(t.perJob, f.owner)
		}
	}
	t.mu.Unlock()
	f.conn.Close()
	f.fl.End(t.s.idleReason())
}

// removeJob closes the job's flows.
func (t *pingTable) removeJob(job netip.Addr) {
	var fs []*pingFlow
	t.mu.Lock()
	for k, f := range t.flows {
		if f.owner == job || k.job == job {
			fs = append(fs, f)
		}
	}
	t.mu.Unlock()
	for _, f := range fs {
		f.fl.End(flows.EndJob)
		t.drop(f)
	}
}

// Close closes every flow; later relays drop their packets.
func (t *pingTable) Close() error {
	t.mu.Lock()
	t.closed = true
	fs := make([]*pingFlow, 0, len(t.flows))
	for _, f := range t.flows {
		fs = append(fs, f)
	}
	t.mu.Unlock()
	for _, f := range fs {
		t.drop(f)
	}
	return nil
}

// logPingAvailability logs at start whether jobs can ping outside hosts,
// over IPv4 (listen) and IPv6 (listen6).
func logPingAvailability(log *slog.Logger, listen, listen6 func() (net.PacketConn, error)) {
	err4, err6 := checkPing(listen), checkPing(listen6)
	switch {
	case err4 != nil:
		log.Warn("ping from jobs to outside hosts is unavailable (pings to the gateway's tunnel address still work)", "err", err4, "fix", PingSysctlHint)
	case errors.Is(err6, syscall.EAFNOSUPPORT):
		log.Info("ping from jobs to outside hosts relayed through ping sockets (IPv4; this host has no IPv6)")
	case err6 != nil:
		log.Warn("ping over IPv6 from jobs to outside hosts is unavailable (IPv4 ping is relayed through ping sockets)", "err", err6)
	default:
		log.Info("ping from jobs to outside hosts relayed through ping sockets (IPv4 and IPv6)")
	}
}
