// SPDX-License-Identifier: MIT

package bypass

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// ICMP echo to bypassed destinations, in netns mode.
//
// gVisor has no ICMP forwarder, and the divert stack, promiscuous, would
// answer an echo request itself. So the job's echo requests that an entry
// bypasses never enter it: the divert stack's write hands them to its
// pinger, which sends each through an unprivileged ICMP "ping" socket of
// the node (socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP), or ICMPv6; allowed
// to the groups in net.ipv4.ping_group_range, else echo is dropped), one
// socket per (destination, the job's echo id), since the kernel rewrites
// the id to the socket's own. Each reply is rebuilt as a packet from the
// destination to the job with the job's id and queued for the job. A flow
// ends after pingIdle without traffic; a job has at most maxPingFlows.

const (
	pingIdle     = 30 * time.Second
	maxPingFlows = 32
)

// pingKey names an echo flow.
type pingKey struct {
	dst netip.Addr
	id  uint16
}

// pinger relays the job's echo requests; safe for concurrent use.
type pinger struct {
	s *divertStack

	mu    sync.Mutex
	flows map[pingKey]*icmp.PacketConn // guarded by mu
}

// echo relays the job's echo request pkt (an IP packet of family f from
// the job, whose ICMP message starts at off), if an entry bypasses its
// destination and the gateway's policy allows it; else drops it.
func (p *pinger) echo(f *ipfamily.Family, pkt []byte, off int) {
	msg := pkt[off:]
	if len(msg) < 8 || msg[1] != 0 {
		return
	}
	dst := f.Addr(pkt, f.DstOff)
	set := p.s.d.eng.Set()
	rule, ok := set.Match(policy.ProtoICMP, dst, 0)
	if !ok || set.Allowed(policy.ProtoICMP, dst, 0, false).Action != policy.Allow {
		return
	}
	k := pingKey{dst: dst, id: binary.BigEndian.Uint16(msg[4:6])}
	c := p.flow(f, k, rule)
	if c == nil {
		return
	}
	c.SetDeadline(time.Now().Add(pingIdle))
	out := append([]byte(nil), msg...)
	out[2], out[3] = 0, 0 // the kernel sets the checksum and the id
	if _, err := c.WriteTo(out, &net.UDPAddr{IP: dst.AsSlice()}); err == nil {
		p.s.d.eng.counters.rule(rule).out.Add(uint64(len(msg) - 8))
	}
}

// flow returns k's ping socket, opening it and its reader if needed (nil
// when it cannot, or the job has maxPingFlows).
func (p *pinger) flow(f *ipfamily.Family, k pingKey, rule string) *icmp.PacketConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.flows[k]; ok {
		return c
	}
	if len(p.flows) >= maxPingFlows || !p.s.enter() {
		return nil
	}
	network, laddr := "udp4", "0.0.0.0"
	if f == ipfamily.V6 {
		network, laddr = "udp6", "::"
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		p.s.wg.Done()
		p.s.d.log.Debug("bypass: no ping socket (net.ipv4.ping_group_range): echo dropped", "err", err)
		return nil
	}
	if p.flows == nil {
		p.flows = map[pingKey]*icmp.PacketConn{}
	}
	p.flows[k] = c
	n := p.s.d.eng.counters.rule(rule)
	n.flows.Add(1)
	go func() {
		defer p.s.wg.Done()
		defer func() {
			p.mu.Lock()
			delete(p.flows, k)
			p.mu.Unlock()
			c.Close()
		}()
		buf := make([]byte, 65535)
		for {
			m, _, err := c.ReadFrom(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					return
				}
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			c.SetDeadline(time.Now().Add(pingIdle))
			if pkt := echoReply(f, k, p.s.d.job[f.Index], buf[:m]); pkt != nil {
				n.in.Add(uint64(m - 8))
				p.s.link.Deliver(pkt)
			}
		}
	}()
	return c
}

// echoReply rebuilds the reply msg (an ICMP message from a ping socket of
// family f) as a packet from k's destination to the job, with the job's
// id; nil if msg is not an echo reply.
func echoReply(f *ipfamily.Family, k pingKey, job netip.Addr, msg []byte) []byte {
	if len(msg) < 8 || msg[0] != f.EchoReply || msg[1] != 0 || !job.IsValid() {
		return nil
	}
	src, dst := tcpip.AddrFromSlice(k.dst.AsSlice()), tcpip.AddrFromSlice(job.AsSlice())
	pkt := make([]byte, f.HeaderLen+len(msg))
	icmpMsg := pkt[f.HeaderLen:]
	copy(icmpMsg, msg)
	binary.BigEndian.PutUint16(icmpMsg[4:6], k.id)
	icmpMsg[2], icmpMsg[3] = 0, 0
	if f == ipfamily.V4 {
		ip := header.IPv4(pkt)
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(pkt)), TTL: 64, Protocol: uint8(header.ICMPv4ProtocolNumber), SrcAddr: src, DstAddr: dst})
		ip.SetChecksum(^ip.CalculateChecksum())
		binary.BigEndian.PutUint16(icmpMsg[2:4], ^checksum.Checksum(icmpMsg, 0))
		return pkt
	}
	header.IPv6(pkt).Encode(&header.IPv6Fields{PayloadLength: uint16(len(icmpMsg)), TransportProtocol: header.ICMPv6ProtocolNumber, HopLimit: 64, SrcAddr: src, DstAddr: dst})
	xsum := header.PseudoHeaderChecksum(header.ICMPv6ProtocolNumber, src, dst, uint16(len(icmpMsg)))
	binary.BigEndian.PutUint16(icmpMsg[2:4], ^checksum.Checksum(icmpMsg, xsum))
	return pkt
}

// echoRequest returns the family of pkt and the offset of its ICMP
// message if it is an unfragmented echo request (IPv6: directly after the
// fixed header).
func echoRequest(pkt []byte) (*ipfamily.Family, int, bool) {
	f := ipfamily.OfPacket(pkt)
	if f == nil || len(pkt) < f.HeaderLen || pkt[f.ProtoOff] != f.ICMP {
		return nil, 0, false
	}
	off := f.HeaderLen
	if f == ipfamily.V4 {
		off = int(pkt[0]&0x0f) * 4
		if off < f.HeaderLen || binary.BigEndian.Uint16(pkt[6:8])&0x3fff != 0 {
			return nil, 0, false
		}
	}
	if len(pkt) < off+8 || pkt[off] != f.EchoRequest {
		return nil, 0, false
	}
	return f, off, true
}

// close ends every echo flow.
func (p *pinger) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.flows {
		c.Close()
	}
}
