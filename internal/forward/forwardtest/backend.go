package forwardtest

import (
	"net/netip"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Backend is the contract the suite checks, method for method the one
// being defined as forward.Backend (branch contract); until that lands,
// each backend's test adapts today's methods to it.
type Backend interface {
	tun.Device
	AddJob(job Job) error
	RemoveJob(addr netip.Addr)
	SetJobLimits(addr netip.Addr, l forward.Limits) error
	SetPolicy(p *policy.Policy) error
	SetGlobalLimits(egressBitsPerSec, ingressBitsPerSec uint64) error
	Stats() (Stats, error)
}

// Job is one job's state as AddJob takes it (forward.Job of the contract).
type Job struct {
	Addr      netip.Addr
	Addr6     netip.Addr
	Egress    netip.Addr
	Block     portblock.Range
	Token     string
	Ref       flows.JobRef
	Limits    forward.Limits
	Exposures []forward.Exposure
}

// Stats are a backend's cumulative counters (forward.Stats).
type Stats struct {
	Limits        forward.LimitStats
	PolicyDrops   map[string]uint64
	BlockRefusals uint64
}
