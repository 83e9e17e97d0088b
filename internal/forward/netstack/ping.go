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
// ICMPv6 echo takes the same path, driven by the family table
// (internal/ipfamily): the job's echo request (an IPv6 packet whose next
// header is ICMPv6, no extension headers) goes out of an ICMPv6 ping
// socket (socket(AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6), governed by the
// same sysctl), and each reply is rebuilt as an IPv6 packet with the
// ICMPv6 checksum over the pseudo-header; only buildEchoReply, which
// writes the headers, differs by family. The flows of all of a job's
// addresses share the per-job cap. A socket is bound to the job's egress
// address of its family (with IP_FREEBIND/IPV6_FREEBIND: a job's own
// address, --egress-prefix, is on no interface).

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

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
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

// listenPingHost opens a host ping socket of family f, bound to local if
// it is a valid address (with IP_FREEBIND/IPV6_FREEBIND, so that a job's
// own address, received through a local route, on no interface, can be
// bound as its TCP and UDP sockets are).
func listenPingHost(f *ipfamily.Family, local netip.Addr) (net.PacketConn, error) {
	domain, proto, level, opt := unix.AF_INET, unix.IPPROTO_ICMP, unix.IPPROTO_IP, unix.IP_FREEBIND
	var sa unix.Sockaddr = &unix.SockaddrInet4{}
	if f == ipfamily.V6 {
		domain, proto, level, opt = unix.AF_INET6, unix.IPPROTO_ICMPV6, unix.IPPROTO_IPV6, unix.IPV6_FREEBIND
		sa = &unix.SockaddrInet6{}
	}
	fd, err := unix.Socket(domain, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	if local.IsValid() && f.Contains(local) && !local.IsUnspecified() {
		switch a := sa.(type) {
		case *unix.SockaddrInet4:
			a.Addr = local.Unmap().As4()
		case *unix.SockaddrInet6:
			a.Addr = local.As16()
		}
		if err := unix.SetsockoptInt(fd, level, opt, 1); err != nil {
			unix.Close(fd)
			return nil, os.NewSyscallError("setsockopt freebind", err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	// As golang.org/x/net/icmp does: the net package takes a datagram
	// socket of any protocol as a UDPConn (WriteTo and ReadFrom with
	// *net.UDPAddr, deadlines).
	file := os.NewFile(uintptr(fd), "icmp-ping")
	defer file.Close()
	c, err := net.FilePacketConn(file)
	if err != nil {
		return nil, fmt.Errorf("ping socket: %w", err)
	}
	return c, nil
}

// checkPing opens and closes one socket of family f with listen and
// returns nil if that works, else an error that says how to enable ping
// sockets.
func checkPing(listen func(*ipfamily.Family, netip.Addr) (net.PacketConn, error), f *ipfamily.Family) error {
	c, err := listen(f, netip.Addr{})
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

// pingKey names one job echo flow: the job's address it comes from (of
// either family) and its echo id.
type pingKey struct {
	job netip.Addr
	id  uint16
}

// pingFlow is one job echo flow and its host socket.
type pingFlow struct {
	key   pingKey
	f     *ipfamily.Family
	owner jobs.ID // its job ("" for an address of no job)
	conn  net.PacketConn
	fl    *flows.Flow  // nil without a flow table
	last  atomic.Int64 // unix nanoseconds of the last request or reply
}

// pingTable holds a Stack's echo flows. It is safe for concurrent use; it
// is registered with the Stack through track, so Stack.Close closes it.
type pingTable struct {
	s      *Stack
	listen func(f *ipfamily.Family, local netip.Addr) (net.PacketConn, error)

	mu     sync.Mutex
	closed bool
	flows  map[pingKey]*pingFlow
	perJob map[jobs.ID]int // the flows of all of a job's addresses share the cap
}

func newPingTable(s *Stack) *pingTable {
	listen := s.cfg.ListenPing
	if listen == nil {
		listen = listenPingHost
	}
	return &pingTable{s: s, listen: listen, flows: make(map[pingKey]*pingFlow), perJob: make(map[jobs.ID]int)}
}

// relay sends the job's echo request in pkt, an IP packet of family f whose
// ICMP message starts at off and runs to its end, to its destination,
// creating the flow's socket on first use. It runs on the Write path: it
// never blocks on the network and copies nothing it keeps. Denied
// requests are counted in Denied, others that cannot be sent in Dropped.
func (t *pingTable) relay(f *ipfamily.Family, pkt []byte, off int) {
	s := t.s
	msg := pkt[off:]
	// Echo request and reply share ICMP's and ICMPv6's layout: type,
	// code, checksum, identifier, sequence number.
	if len(msg) < header.ICMPv4MinimumSize || msg[0] != f.EchoRequest || msg[1] != 0 {
		s.stats.dropped.Add(1)
		return
	}
	src, dst := f.Addr(pkt, f.SrcOff), f.Addr(pkt, f.DstOff)
	id := header.ICMPv4(msg).Ident()
	if err := s.checkFlow(netip.AddrPortFrom(src, id), policy.ProtoICMP, netip.AddrPortFrom(dst, 0)); err != nil {
		s.stats.denied.Add(1)
		if s.flowDebugOn() {
			s.log.Debug("icmp echo denied", "src", src, "dst", dst, "err", err)
		}
		return
	}
	k := pingKey{job: src, id: id}
	pf := t.flow(f, k, dst)
	if pf == nil {
		s.stats.dropped.Add(1)
		return
	}
	pf.last.Store(time.Now().UnixNano())
	if _, err := pf.conn.WriteTo(msg, &net.UDPAddr{IP: dst.AsSlice()}); err != nil {
		s.stats.dropped.Add(1)
		if s.flowDebugOn() {
			s.log.Debug("icmp echo send failed", "src", src, "dst", dst, "err", err)
		}
	} else {
		pf.fl.AddOut(uint64(len(msg)), 1)
	}
}

// flow returns the flow of k (family f), opening its socket and starting
// its reader; nil if the job has too many flows or the socket cannot be
// opened. dst is the first request's destination, recorded in the flow
// table.
func (t *pingTable) flow(f *ipfamily.Family, k pingKey, dst netip.Addr) *pingFlow {
	owner, _ := t.s.reg.Lookup(k.job)
	t.mu.Lock()
	pf, ok := t.flows[k]
	full := t.perJob[owner] >= maxPingFlowsPerJob
	closed := t.closed
	t.mu.Unlock()
	if ok {
		return pf
	}
	if full || closed {
		return nil
	}
	// The job's echo flows leave from its egress address of f, as its
	// TCP and UDP flows do.
	je, _ := t.s.egressOf(k.job, dst)
	c, err := t.listen(f, je.addr)
	if err != nil {
		if t.s.flowLog.Allow() {
			t.s.log.Warn("icmp echo from job dropped: cannot open ping socket", "job", k.job, "err", err)
		}
		return nil
	}
	pf = &pingFlow{key: k, f: f, owner: owner, conn: c}
	pf.last.Store(time.Now().UnixNano())
	t.mu.Lock()
	if old, ok := t.flows[k]; ok || t.closed || t.perJob[owner] >= maxPingFlowsPerJob {
		t.mu.Unlock()
		c.Close()
		return old // nil unless another Write raced us to it
	}
	t.flows[k] = pf
	t.perJob[owner]++
	t.mu.Unlock()
	pf.fl = t.s.openFlow(flows.ProtoICMP, netip.AddrPortFrom(k.job, k.id), netip.AddrPortFrom(dst, 0), flows.Egress)
	if pf.fl != nil {
		pf.fl.SetCloser(c)
	}
	if !t.s.goStart(func() { t.receive(pf) }) {
		t.drop(pf)
		return nil
	}
	if t.s.flowDebugOn() {
		t.s.log.Debug("icmp echo flow opened", "job", k.job, "id", k.id, "local", c.LocalAddr())
	}
	return pf
}

// receive delivers the echo replies of pf to its job until pf is idle for
// pingIdleTimeout or closed.
func (t *pingTable) receive(pf *pingFlow) {
	defer t.drop(pf)
	var buf [1 << 16]byte
	f := pf.f
	hdr := f.HeaderLen
	for {
		_ = pf.conn.SetReadDeadline(time.Now().Add(pingIdleTimeout))
		n, from, err := pf.conn.ReadFrom(buf[hdr:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, pf.last.Load())) < pingIdleTimeout {
				continue
			}
			return
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok {
			continue
		}
		peer, ok := netip.AddrFromSlice(ua.IP)
		if !ok || ipfamily.Of(peer) != f || n < header.ICMPv4MinimumSize || buf[hdr] != f.EchoReply {
			continue
		}
		pkt := buildEchoReply(f, buf[:hdr+n], peer.Unmap(), pf.key.job, pf.key.id)
		pf.last.Store(time.Now().UnixNano())
		if !t.s.ep.Deliver(pkt) {
			t.s.stats.dropped.Add(1)
		} else {
			pf.fl.AddIn(uint64(n), 1)
		}
	}
}

// buildEchoReply completes p = room for a header of family f | an echo
// reply as an IP packet from src to dst with echo id, and returns it: the
// one place where the families' headers and checksums differ.
func buildEchoReply(f *ipfamily.Family, p []byte, src, dst netip.Addr, id uint16) []byte {
	msg := header.ICMPv4(p[f.HeaderLen:])
	msg.SetIdent(id)
	msg.SetChecksum(0)
	s, d := tcpip.AddrFromSlice(src.AsSlice()), tcpip.AddrFromSlice(dst.AsSlice())
	if f == ipfamily.V6 {
		msg.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{Header: header.ICMPv6(msg), Src: s, Dst: d}))
		header.IPv6(p).Encode(&header.IPv6Fields{
			PayloadLength: uint16(len(msg)), TransportProtocol: header.ICMPv6ProtocolNumber,
			HopLimit: pingTTL, SrcAddr: s, DstAddr: d,
		})
		return p
	}
	msg.SetChecksum(^checksum.Checksum(msg, 0))
	ip := header.IPv4(p)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(p)), Flags: header.IPv4FlagDontFragment, TTL: pingTTL,
		Protocol: uint8(header.ICMPv4ProtocolNumber), SrcAddr: s, DstAddr: d,
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	return p
}

// drop closes pf and forgets it.
func (t *pingTable) drop(pf *pingFlow) {
	t.mu.Lock()
	if t.flows[pf.key] == pf {
		delete(t.flows, pf.key)
		if t.perJob[pf.owner]--; t.perJob[pf.owner] <= 0 {
			delete(t.perJob, pf.owner)
		}
	}
	t.mu.Unlock()
	pf.conn.Close()
	pf.fl.End(t.s.idleReason())
}

// removeJob closes the echo flows of job id.
func (t *pingTable) removeJob(id jobs.ID) {
	var fs []*pingFlow
	t.mu.Lock()
	for _, pf := range t.flows {
		if pf.owner == id {
			fs = append(fs, pf)
		}
	}
	t.mu.Unlock()
	for _, pf := range fs {
		pf.fl.End(flows.EndJob)
		t.drop(pf)
	}
}

// Close closes every flow; later relays drop their packets.
func (t *pingTable) Close() error {
	t.mu.Lock()
	t.closed = true
	fs := make([]*pingFlow, 0, len(t.flows))
	for _, pf := range t.flows {
		fs = append(fs, pf)
	}
	t.mu.Unlock()
	for _, pf := range fs {
		t.drop(pf)
	}
	return nil
}

// logPingAvailability logs at start whether jobs can ping outside hosts,
// over each family.
func logPingAvailability(log *slog.Logger, listen func(*ipfamily.Family, netip.Addr) (net.PacketConn, error)) {
	err4, err6 := checkPing(listen, ipfamily.V4), checkPing(listen, ipfamily.V6)
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
