// SPDX-License-Identifier: MIT

package forward

import (
	"errors"
	"net/netip"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Backend is the complete contract of an egress backend. The gateway holds
// one Backend and makes no type assertions on it; a backend that cannot do
// something a call asks for returns an error wrapping ErrNotSupported.
// All methods are safe for concurrent use.
//
// Packets. The tun.Device is what the WireGuard device reads jobs' packets
// from and writes them to. Write takes IPv4/IPv6 packets sent by jobs in
// bufs[i][offset:] (the buffers are owned by the caller and not retained
// after Write returns); Read blocks until at least one packet for a job is
// ready and fills bufs[i][offset:] with whole IP packets and sizes[i] with
// their lengths. Close stops the backend, removes every job, closes every
// flow, undoes what the backend changed on the host, and makes pending and
// future Read and Write calls return an error; it is idempotent.
//
// Jobs. A job is its ID (jobs.ID); its tunnel addresses, at most one per
// address family, are attributes. AddJob admits a job before its WireGuard
// peer is; RemoveJob forgets it after the peer is gone. Between the two,
// the job's new flows of each family leave from its egress address and
// port block of that family, are decided by the policy in force with the
// job's token, and are held to its limits, which count the flows of all
// its addresses together; its exposures carry inbound connections to it.
// The backend adds the job's addresses to the job index it was made with
// (each backend's Config.Jobs; the flow table's, which the gateway shares
// with its capture taps) and removes them with the job.
//
// Flow events. A backend is made with a *flows.Table (nil: none; the field
// is in each backend's Config) and reports to it every flow it carries:
// flows.Table.Open when a flow of a job is forwarded (Src is the job side
// for flows.Egress, Dst for flows.Inbound), the flow's bytes and packets as
// they pass, flows.Flow.End with the reason, and every new flow it refuses
// with the verdict (flows.Denied(rule), flows.FlowLimit,
// flows.NewFlowRate, flows.BlockExhausted, ...): flows.Table.Refuse per
// flow, or flows.Table.CountRefused where the refusals happen in the
// kernel and only their counters can be read. AddJob registers the job in
// the table, so the flows of all its addresses are attributed to it;
// RemoveJob ends the job's open flows (flows.EndJob) and forgets it. Jobs
// (jobs.go) is the part of AddJob and RemoveJob every backend shares.
type Backend interface {
	tun.Device

	// AddJob admits job. It is all or nothing: on success every part of
	// job is in force (address, egress address, port block, token,
	// limits, exposures, flow attribution); on error nothing of it
	// remains and the backend is as it was before the call. A job whose
	// ID, or one of whose addresses, is already added fails with
	// ErrJobExists and is left as it was.
	AddJob(job Job) error

	// RemoveJob removes job id: its exposures and their connections, its
	// addresses, port blocks and egress addresses, its token and limits,
	// its DNS state; its open flows end with flows.EndJob. It is a no-op
	// for an ID AddJob did not add.
	RemoveJob(id jobs.ID)

	// SetJobLimits replaces the limits of job id (a zero limits.Job
	// removes them). Bandwidth limits take effect for the job's open
	// flows too, flow limits for its new flows. It returns ErrUnknownJob
	// for an ID AddJob did not add; on any error the job keeps its old
	// limits.
	SetJobLimits(id jobs.ID, l limits.Job) error

	// SetPolicy replaces the egress policy (package policy) for flows
	// opened afterwards; flows already open are left alone. On error the
	// old policy stays in force. Before the first SetPolicy a backend
	// enforces the zero policy.Policy (allow all but the built-in
	// protections); nil means the zero policy too. A denied TCP
	// connection is reset at once (the job sees "connection refused");
	// denied UDP datagrams and ICMP echo requests are dropped; every
	// denial is counted under the name of the rule that decided it
	// (Stats.PolicyDrops).
	SetPolicy(p *policy.Policy) error

	// SetGlobalLimits caps all jobs together per direction, in bits per
	// second (0: unlimited), in addition to each job's own limits. It
	// takes effect for open flows too.
	SetGlobalLimits(egressBitsPerSec, ingressBitsPerSec uint64) error

	// Stats returns the backend's cumulative counters. Counts never go
	// down, also across SetPolicy calls and RemoveJob.
	Stats() (Stats, error)

	// Queues returns how many goroutines may call Read at once, each
	// then waiting on a queue of its own (a multi-queue TUN,
	// internal/mqtun): the WireGuard device runs that many readers. 1
	// means one reader; more would wait behind it.
	Queues() int
}

// Job is one job's state in an egress backend, as AddJob takes it. Fields
// may be added; their zero value keeps today's behaviour.
type Job struct {
	// ID names the job in every other call. Required.
	ID jobs.ID
	// Addrs are the job's tunnel addresses: at least one, at most one
	// per address family, each a host address of the backend's tunnel
	// subnet of its family other than the gateway's. A backend without
	// a tunnel subnet of a family rejects an address of it with
	// ErrNotSupported.
	Addrs []netip.Addr
	// Egress says where the job's outside flows leave from: at most one
	// entry per family, for a family of Addrs. A family without one
	// leaves from the backend's configured egress address of the family,
	// with any source port.
	Egress []Egress
	// Ref attributes the job's flows in the flow table; Ref.Token, the
	// name of the token the job joined with, scopes token-scoped policy
	// rules ("" matches only rules without tokens).
	Ref jobs.Ref
	// Limits are the job's traffic limits (zero: none), for the flows of
	// all its addresses together.
	Limits limits.Job
	// Exposures are the job's inbound mappings (`airlock run --expose`).
	Exposures []Exposure
}

// Egress is where a job's outside flows of one address family leave from.
type Egress struct {
	// Addr is the public address, of the flows' family. The family's
	// unspecified address means the backend's configured egress address
	// of that family (user mode without one: the host's choice per
	// destination).
	Addr netip.Addr
	// Block is the job's port block: the source ports of its outside TCP
	// and UDP flows of the family, on Addr. The zero Range means any
	// port.
	Block portblock.Range
	// Own says Addr is the job's own public address (--egress-prefix):
	// no other job's flows leave from it, so the job keeps its ports
	// (Block must be zero) and its exposures listen at their job port.
	Own bool
}

// EgressOf returns the job's egress entry of address family f, and false
// if it has none.
func (j Job) EgressOf(f *ipfamily.Family) (Egress, bool) {
	for _, e := range j.Egress {
		if f.Contains(e.Addr) {
			return e, true
		}
	}
	return Egress{}, false
}

// AddrOf returns the job's tunnel address of family f, and false if it
// has none.
func (j Job) AddrOf(f *ipfamily.Family) (netip.Addr, bool) {
	for _, a := range j.Addrs {
		if f.Contains(a) {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// Stats are an egress backend's cumulative counters, for metrics and logs.
type Stats struct {
	// Limits counts what the limits refused or dropped.
	Limits limits.Stats
	// PolicyDrops counts denied flows (TCP connections, UDP datagrams,
	// ICMP echo requests) per rule name: the policy's rule names and the
	// built-in ones (policy.RuleFloor, policy.RuleHost,
	// policy.RuleLinkLocal, policy.RulePrivate, policy.RuleInternal,
	// policy.RuleMetadata, policy.RuleDefault). Rules that never denied
	// anything may be absent. It is the source of the "policy drops by
	// rule" metric. The map is the caller's.
	PolicyDrops map[string]uint64
	// BlockRefusals counts new flows refused because the job's port
	// block had no free port towards the destination.
	BlockRefusals uint64
}

// Errors of Backend methods, checked with errors.Is.
var (
	// ErrUnknownJob is returned by SetJobLimits for a job AddJob did not
	// add.
	ErrUnknownJob = errors.New("unknown job")
	// ErrJobExists is returned by AddJob for an ID or a tunnel address
	// already added.
	ErrJobExists = errors.New("job already added")
	// ErrNotSupported is wrapped by the errors of calls that ask a
	// backend for something it cannot do (e.g. an IPv6 tunnel address on
	// a backend without IPv6).
	ErrNotSupported = errors.New("not supported by this egress backend")
)
