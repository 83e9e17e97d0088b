package forward

import (
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

// DualStack is implemented by forwarders that carry jobs' IPv6 traffic
// beside their IPv4 traffic. The gateway gives jobs IPv6 tunnel addresses
// only when its forwarder implements it.
//
// AddJob6 is called after AddJob (before the job's WireGuard peer is
// admitted): job is the job's IPv4 tunnel address, which keeps naming the
// job, addr6 its IPv6 tunnel address. The job's IPv6 flows share its
// policy token, limits and flow accounting, and leave from egress6 (the
// zero Addr: the backend's choice per destination) with a source port
// from block (the zero Range: any port; a job with its own public IPv6
// address has no block). RemoveJob(job) removes the IPv6 address too.
// Implementations are safe for concurrent use.
type DualStack interface {
	AddJob6(job, addr6, egress6 netip.Addr, block portblock.Range) error
}
