package netstack

import (
	"context"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Link is this package's link endpoint (GRO inbound, GSO outbound split
// into MTU-sized packets, batched reads; see the theory of operation in
// link.go) for a netstack other than the gateway's: airlock run's
// client-side stack in the fallback modes. It is safe for concurrent use.
type Link struct {
	e       *linkEndpoint
	dropped atomic.Uint64
}

// NewLink returns a link of the given MTU that queues at most queue
// outbound packets.
func NewLink(mtu uint32, queue int) *Link {
	l := &Link{}
	l.e = newLinkEndpoint(mtu, queue, func() { l.dropped.Add(1) })
	return l
}

// Endpoint is the gVisor link endpoint to create the NIC with.
func (l *Link) Endpoint() stack.LinkEndpoint { return l.e }

// Inject delivers the IPv4/IPv6 packets bufs[i][offset:] (from WireGuard,
// authenticated) to the netstack; others are dropped and counted. The
// buffers are copied and not retained.
func (l *Link) Inject(bufs [][]byte, offset int) {
	if refused := l.e.inject(bufs, offset, ipProto); refused > 0 {
		l.dropped.Add(uint64(refused))
	}
}

// ipProto admits IPv4 and IPv6 packets of at least a header's length.
func ipProto(p []byte) (tcpip.NetworkProtocolNumber, bool) {
	switch {
	case len(p) >= header.IPv4MinimumSize && p[0]>>4 == 4:
		return ipv4.ProtocolNumber, true
	case len(p) >= header.IPv6MinimumSize && p[0]>>4 == 6:
		return ipv6.ProtocolNumber, true
	}
	return 0, false
}

// Read blocks until the netstack has sent at least one packet, then writes
// up to len(bufs) IP packets into bufs[i][offset:] and their lengths into
// sizes[i]. It returns ok false once ctx is done or the link is closed.
func (l *Link) Read(ctx context.Context, bufs [][]byte, sizes []int, offset int) (n int, ok bool) {
	return l.e.read(ctx, bufs, sizes, offset)
}

// Dropped counts packets dropped in either direction.
func (l *Link) Dropped() uint64 { return l.dropped.Load() }

// Close closes the link; pending and later Reads return ok false.
func (l *Link) Close() { l.e.close() }
