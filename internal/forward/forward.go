// SPDX-License-Identifier: MIT

// Package forward is the contract between the gateway and its egress
// backends, which carry packets between the gateway's WireGuard device and
// the outside world: Backend (backend.go) and the per-job state it takes
// (Job, Exposure). Backends: forward/netstack (user mode: an unprivileged
// gVisor netstack that re-originates jobs' flows as host sockets, with the
// job side of TCP terminated by the kernel of a private namespace or by
// gVisor) and forward/kernel (kernel mode: a kernel TUN with IP forwarding
// and nftables). Every backend passes the conformance suite in
// forward/forwardtest.
package forward

import (
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/ipproto"
)

// Exposure is one inbound mapping of a job: connections (TCP) or datagrams
// (UDP) that reach PublicAddr on PublicPort are carried to the job's
// tunnel address of PublicAddr's family on JobPort. A job exposed over
// both families has one Exposure per family.
type Exposure struct {
	// Proto is ipproto.TCP or ipproto.UDP.
	Proto      ipproto.Proto
	JobPort    uint16
	PublicPort uint16
	// PublicAddr is the public address the mapping listens on: the job's
	// egress address of its family (the gateway decides the public port
	// too, the job's own port at a job's own address). The family's
	// unspecified address means the backend's configured egress address
	// of the family. Required: it says the family.
	PublicAddr netip.Addr
}

// Family returns the exposure's address family, nil without a public
// address.
func (x Exposure) Family() *ipfamily.Family { return ipfamily.Of(x.PublicAddr) }
