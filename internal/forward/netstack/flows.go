// SPDX-License-Identifier: MIT

package netstack

// Flow accounting in user mode. Every TCP, UDP and ICMP echo flow the
// Stack relays, egress or inbound through an exposed port, is opened in
// the Config's flow table (internal/flows) once it is admitted and dialled,
// and ended when its relay ends. Bytes are transport payload as relayed:
// TCP stream bytes, UDP datagram payloads, ICMP messages (header and
// data). They are counted per relayed chunk or datagram with atomic adds,
// which allocate nothing.
//
// Packets: UDP datagrams and ICMP messages are counted one by one, exactly.
// For TCP the relay sees a byte stream, not packets; the job-side packet
// counts come from the job-side socket, read when the flow is shown or
// ends. On the kernel TCP path (KernelTCP) they are the kernel socket's
// TCP_INFO tcpi_segs_in and tcpi_segs_out (flows_linux.go), which count a
// GRO-merged packet as the segments it merged: the packets that crossed
// the tunnel, handshake, ACK-only and FIN segments included. On the
// netstack path they are the gVisor endpoint's segment counters
// (SegmentsReceived from the job, SegmentsSent to it), where segments the
// link endpoint coalesced (GRO, from the job) or that the netstack sent as
// one GSO segment (to the job) count once, so bulk transfers show fewer
// packets than crossed the tunnel. Inbound TCP flows count no packets.
//
// Refusals the Stack decides itself are reported to the table: the job's
// flow limit, its new-flow rate, an exhausted port block, and policy
// denials (verdict flows.Denied(rule), from checkFlow).

import (
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// openFlow starts tracking an admitted flow; nil when the Stack has no flow
// table (every flows.Flow method accepts nil).
func (s *Stack) openFlow(proto ipproto.Proto, src, dst netip.AddrPort, dir string) *flows.Flow {
	if s.cfg.Flows == nil {
		return nil
	}
	return s.cfg.Flows.Open(flows.Key{Proto: proto, Src: src, Dst: dst}, dir)
}

// refuseFlow reports a refused egress flow of the job at src.
func (s *Stack) refuseFlow(proto ipproto.Proto, src, dst netip.AddrPort, verdict string) {
	if s.cfg.Flows == nil {
		return
	}
	s.cfg.Flows.Refuse(flows.Key{Proto: proto, Src: src, Dst: dst}, flows.Egress, verdict)
}

// tcpSegments returns a function that reads ep's segment counters: from
// the job (out) and to it (in).
func tcpSegments(ep tcpip.Endpoint) func() (out, in uint64) {
	st, ok := ep.Stats().(*tcp.Stats)
	if !ok {
		return nil
	}
	return func() (uint64, uint64) { return st.SegmentsReceived.Value(), st.SegmentsSent.Value() }
}

// endReason is why a flow whose relay just ended is over: the Stack closed,
// or it ended by itself.
func (s *Stack) endReason() string {
	if s.ctx.Err() != nil {
		return flows.EndStopped
	}
	return flows.EndClosed
}

// idleReason is endReason for flows that only end by idling (UDP).
func (s *Stack) idleReason() string {
	if s.ctx.Err() != nil {
		return flows.EndStopped
	}
	return flows.EndIdle
}

// refuseDenied reports a flow the policy (or the floor) denied under rule.
// The verdict strings are kept per rule, so that a denied packet does not
// allocate one.
func (s *Stack) refuseDenied(proto policy.Proto, src, dst netip.AddrPort, rule string) {
	if s.cfg.Flows == nil {
		return
	}
	v, ok := s.denied.Load(rule)
	if !ok {
		v, _ = s.denied.LoadOrStore(rule, flows.Denied(rule))
	}
	s.cfg.Flows.Refuse(flows.Key{Proto: proto, Src: src, Dst: dst}, flows.Egress, v.(string))
}

// localPort is the local port of c, the source port the outside sees an
// egress flow come from; 0 if c has none.
func localPort(c net.Conn) uint16 {
	if c == nil {
		return 0
	}
	switch a := c.LocalAddr().(type) {
	case *net.TCPAddr:
		return uint16(a.Port)
	case *net.UDPAddr:
		return uint16(a.Port)
	}
	return 0
}
