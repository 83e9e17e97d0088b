// SPDX-License-Identifier: MIT

package forward

import (
	"errors"
	"net/netip"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/flows"
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
// Jobs. AddJob admits a job before its WireGuard peer is; RemoveJob forgets
// it after the peer is gone. Between the two, the job's new flows leave
// from its egress address and port block, are decided by the policy in
// force with the job's token, and are held to its limits; its exposures
// carry inbound connections to it.
//
// Flow events. A backend is made with a *flows.Table (nil: none; the field
// is in each backend's Config) and reports to it every flow it carries:
// flows.Table.Open when a flow of a job is forwarded (Src is the job side
// for flows.Egress, Dst for flows.Inbound), the flow's bytes and packets as
// they pass, flows.Flow.End with the reason, and every new flow it refuses
// with the verdict (flows.Denied(rule), flows.FlowLimit,
// flows.NewFlowRate, flows.BlockExhausted, ...): flows.Table.Refuse per
// flow, or flows.Table.CountRefused where the refusals happen in the
// kernel and only their counters can be read. AddJob
// registers Job.Ref in the table, so the job's flows are attributed;
// RemoveJob ends the job's open flows (flows.EndJob) and forgets it.
type Backend interface {
	tun.Device

	// AddJob admits job. It is all or nothing: on success every part of
	// job is in force (address, egress address, port block, token,
	// limits, exposures, flow attribution); on error nothing of it
	// remains and the backend is as it was before the call. A job whose
	// Addr is already added fails with ErrJobExists and is left as it
	// was.
	AddJob(job Job) error

	// RemoveJob removes the job at addr (its Job.Addr): its exposures
	// and their connections, its port block and egress address, its
	// token and limits, its DNS state; its open flows end with
	// flows.EndJob. It is a no-op for an address AddJob did not add.
	RemoveJob(addr netip.Addr)

	// SetJobLimits replaces the limits of the job at addr (a zero
	// limits.Job removes them). Bandwidth limits take effect for the
	// job's open flows too, flow limits for its new flows. It returns
	// ErrUnknownJob for an address AddJob did not add; on any error the
	// job keeps its old limits.
	SetJobLimits(addr netip.Addr, l limits.Job) error

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
}

// Job is one job's state in an egress backend, as AddJob takes it. Fields
// may be added; their zero value keeps today's behaviour.
type Job struct {
	// Addr is the job's tunnel address, in the backend's tunnel subnet.
	// It names the job in every other call. Required.
	Addr netip.Addr
	// Addr6 is the job's IPv6 tunnel address; the zero Addr means the job
	// has none. A backend without IPv6 tunnel addresses rejects a valid
	// one with ErrNotSupported.
	Addr6 netip.Addr
	// Egress is the public IPv4 address the job's outside flows leave
	// from and its exposures listen on; the zero Addr means the
	// backend's configured egress address.
	Egress netip.Addr
	// Egress6 is the public IPv6 address of the job's outside IPv6 flows;
	// the zero Addr means the backend's choice. A backend without IPv6
	// egress rejects a valid one with ErrNotSupported.
	Egress6 netip.Addr
	// Block is the job's port block: the source ports its outside TCP
	// and UDP flows use, on Egress. The zero Range means the job has
	// none (any port).
	Block portblock.Range
	// Block6 is the port block of the job's IPv6 flows on Egress6: the
	// job's Block when Egress6 is shared by jobs, the zero Range (any
	// port, no translation) when Egress6 is the job's own address
	// (--egress-prefix6).
	Block6 portblock.Range
	// Token is the name of the token the job joined with, for
	// token-scoped policy rules; "" matches only rules without tokens.
	Token string
	// Ref attributes the job's flows in the flow table.
	Ref flows.JobRef
	// Limits are the job's traffic limits (zero: none).
	Limits limits.Job
	// Exposures are the job's inbound mappings (`airlock run --expose`).
	Exposures []Exposure
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
	// ErrJobExists is returned by AddJob for an address already added.
	ErrJobExists = errors.New("job already added")
	// ErrNotSupported is wrapped by the errors of calls that ask a
	// backend for something it cannot do (e.g. an IPv6 tunnel address on
	// a backend without IPv6).
	ErrNotSupported = errors.New("not supported by this egress backend")
)
