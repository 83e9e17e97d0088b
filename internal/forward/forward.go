// Package forward carries packets between the gateway's WireGuard device and
// the outside world. Backends: netstack (user mode, unprivileged gVisor stack
// that re-originates flows as host sockets) and later kernel (kernel TUN with
// IP forwarding and nftables).
package forward

import (
	"net/netip"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Forwarder is the gateway's egress backend: the tun.Device that the
// WireGuard device reads job packets from and writes them to.
//
// Write takes IPv4/IPv6 packets sent by jobs (buffers are owned by the caller
// and not retained after Write returns); Read blocks until at least one
// packet for a job is ready and fills bufs[i][offset:] with whole IP packets.
// Close stops the backend, closes every flow, and makes pending and future
// Read and Write calls return an error. Implementations are safe for
// concurrent use.
type Forwarder interface {
	tun.Device
}

// Jobs is implemented by forwarders that keep per-job egress state: each
// job's tunnel address, the public address its outside connections leave
// from (egress; the zero Addr means the backend's configured egress
// address) and the port block they must use (an invalid, zero Block means
// the job has none). The gateway calls AddJob before the job's WireGuard
// peer is admitted and RemoveJob after it is removed. AddJob for an
// address already added replaces its egress address and block.
type Jobs interface {
	AddJob(addr, egress netip.Addr, block portblock.Range) error
	RemoveJob(addr netip.Addr)
}

// Exposure is one inbound mapping of a job: connections (TCP) or datagrams
// (UDP) that reach the gateway's public address on PublicPort are carried
// to the job's tunnel address on JobPort.
type Exposure struct {
	// Proto is ipproto.TCP or ipproto.UDP.
	Proto      ipproto.Proto
	JobPort    uint16
	PublicPort uint16
	// PublicAddr is the public address the mapping listens on: the job's
	// egress address; the zero Addr means the backend's configured one.
	PublicAddr netip.Addr
}

// Exposer is implemented by forwarders that can carry inbound connections
// from the gateway's public address to jobs. The gateway calls Expose after
// AddJob (before the job's WireGuard peer is admitted) with every mapping
// of the job, and Unexpose when the lease ends, before RemoveJob. Expose
// for a job that already has exposures replaces them; on error nothing of
// ex stays exposed. Unexpose closes the listeners and the connections they
// carried; it is a no-op for a job without exposures. Implementations are
// safe for concurrent use.
type Exposer interface {
	Expose(job netip.Addr, ex []Exposure) error
	Unexpose(job netip.Addr)
}
