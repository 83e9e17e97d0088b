// SPDX-License-Identifier: MIT

// Package control implements Airlock's control protocol: the messages a
// client and a gateway exchange over TLS to join, renew and release a lease,
// the gateway's HTTPS server for them, the client side, and certificate
// pinning by public-key fingerprint.
//
// The protocol is JSON over HTTPS on the gateway's TCP port. Every request
// body and response body is one JSON object; errors are returned as an
// [ErrorResponse] with a machine-readable code and a sentence for humans.
package control

import (
	"net/netip"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// Version is the protocol version carried in every request path.
const Version = "v1"

// Paths of the control API, relative to https://HOST:PORT.
const (
	PathJoin    = "/" + Version + "/join"
	PathRenew   = "/" + Version + "/renew"
	PathRelease = "/" + Version + "/release"
	PathHealth  = "/" + Version + "/health"
)

// JobInfo describes the job that asks to join. All fields are informational:
// they are recorded with the lease and shown to admins, never trusted for
// authorization.
type JobInfo struct {
	// BatchJobID is the batch system's job id (SLURM_JOB_ID, PBS_JOBID, ...),
	// empty when not run under a batch system.
	BatchJobID string `json:"batch_job_id,omitempty"`
	// BatchSystem names where BatchJobID came from, e.g. "slurm".
	BatchSystem string `json:"batch_system,omitempty"`
	Hostname    string `json:"hostname,omitempty"`
	User        string `json:"user,omitempty"`
	UID         int    `json:"uid"`
	// Command is the job's argv[0], for the admin's eyes only.
	Command string `json:"command,omitempty"`
}

// JoinRequest asks the gateway for a lease.
type JoinRequest struct {
	// Token is the join token; it may be empty for a join with Attest
	// when the gateway takes attested joins without one.
	Token string `json:"token"`
	// PublicKey is the client's WireGuard public key, base64 (standard
	// encoding, 32 bytes) on the wire, validated as it is decoded.
	PublicKey wgkey.Key `json:"public_key"`
	Job       JobInfo   `json:"job"`
	// Expose lists the job's ports that the gateway should make reachable
	// from outside on its public address (`airlock run --expose`).
	Expose []Port `json:"expose,omitempty"`
	// Ports, if not zero, is how many egress ports the job asks for
	// (`airlock run --ports`): the gateway grants at least that many, up
	// to its --max-block-size, or refuses the join. Zero leaves the size
	// to the gateway (its token's block_size, else --block-size). A
	// gateway older than this field refuses a join that sets it.
	Ports int `json:"ports,omitempty"`
	// Replace, if set, names the live lease that this join replaces and
	// proves the joiner holds it. A join whose public key already holds a
	// live lease is refused (CodeKeyInUse) without it, so that knowing a
	// job's public key is not enough to evict it.
	Replace *LeaseRef `json:"replace,omitempty"`
	// Version is the client's airlock version (semantic, "v0.3.0"); empty
	// from clients before the version exchange. The gateway refuses one
	// it cannot serve with CodeVersionUnsupported.
	Version string `json:"version,omitempty"`
	// Attest carries the join's MUNGE credentials (attest.go).
	Attest *Attest `json:"attest,omitempty"`
	// Attested is what the gateway's Attester verified of Attest: set by
	// the control server before Backend.Join, never from the wire.
	Attested *identity.Attestation `json:"-"`
	// Bearer is the job's bearer token (bearer.go), if the client found
	// one and the gateway takes them (Health.Bearer).
	Bearer string `json:"bearer,omitempty"`
	// Issued is what the gateway's BearerVerifier verified of Bearer:
	// set by the control server before Backend.Join, never from the
	// wire.
	Issued *identity.Issued `json:"-"`
}

// Port is a transport protocol and port number, as in `--expose 8080/udp`.
type Port struct {
	// Proto is ProtoTCP or ProtoUDP.
	Proto ipproto.Proto `json:"proto"`
	Port  uint16        `json:"port"`
}

// Transport protocols of [Port].
const (
	ProtoTCP = ipproto.TCP
	ProtoUDP = ipproto.UDP
)

// Exposed is one inbound mapping granted with a lease: connections to
// PublicAddr:PublicPort reach the job's Port.
type Exposed struct {
	Port
	PublicAddr netip.Addr `json:"public_addr"`
	PublicPort uint16     `json:"public_port"`
}

// Lease is what a successful join returns: everything the client needs to
// configure the job's namespace and its WireGuard peer.
type Lease struct {
	// ID names the lease in renew and release requests and in logs.
	ID string `json:"id"`
	// Secret authorizes renew and release of this lease; it is shown only
	// to the client that joined.
	Secret string `json:"secret"`
	// Addresses are the job's tunnel addresses, each with its tunnel
	// prefix's length (100.64.0.2/16, fd00:1::6440:2/48): at most one per
	// family, IPv4 first; one IPv6 address on an IPv6-only tunnel. The
	// job's default route of each family goes to the gateway's address of
	// that family in Gateways. On the wire: leasewire.go.
	Addresses []netip.Prefix `json:"-"`
	// Gateways are the gateway's tunnel addresses, one per family of
	// Addresses, in the same order. They are also the job's DNS servers.
	Gateways []netip.Addr `json:"-"`
	// DNS lists the resolvers the job should use: Gateways, in order.
	DNS []netip.Addr `json:"dns"`
	// PublicAddrs are where the job's outside flows leave from, at most
	// one per family, IPv4 first: an IPv4 one with a source port in
	// Ports[0]..Ports[1] (0.0.0.0 when the gateway uses every address of
	// its host); an IPv6 one with the port block Ports, or, if it is the
	// job's own address (the gateway's --egress-prefix), with any port.
	// Empty when the job has no block and no IPv6 egress address is known.
	PublicAddrs []netip.Addr `json:"-"`
	// Ports is the job's egress port block; zero when it has none.
	Ports [2]uint16 `json:"ports,omitzero"`
	// Exposed lists the inbound mappings of the ports the join asked to
	// expose, each on the public address it names: those on the gateway's
	// IPv4 egress address in the order asked, then those on its IPv6 one
	// (or, with --egress-prefix, the job's own address and port).
	Exposed []Exposed `json:"-"`
	// MTU of the job's TUN device: one that every path carries (1420).
	MTU int `json:"mtu"`
	// MaxMTU, if larger than MTU, is the largest tunnel MTU the gateway
	// offers on its path to the client; the client takes it (or what its
	// own route allows) only after a probe of that size with MTUProbe
	// went to the gateway's UDP endpoint and back (tunnel.ProbeMTU).
	// Zero: the gateway offers no more than MTU (kernel mode, older
	// gateways).
	MaxMTU int `json:"max_mtu,omitempty"`
	// MTUProbe is the token a path MTU probe carries (tunnel.ProbeKey);
	// base64 on the wire.
	MTUProbe []byte `json:"mtu_probe,omitempty"`
	// GatewayPublicKey is the gateway's WireGuard public key, base64 on
	// the wire, validated as it is decoded.
	GatewayPublicKey wgkey.Key `json:"gateway_public_key"`
	// Endpoint is the gateway's WireGuard UDP endpoint, HOST:PORT.
	Endpoint string `json:"endpoint"`
	// RenewInterval is how often the client must renew; a lease not
	// renewed within Expires is freed.
	RenewInterval Duration  `json:"renew_interval"`
	Expires       time.Time `json:"expires"`
	// Bypass is the job's site-local bypass (bypass.go); nil: none.
	Bypass *Bypass `json:"bypass,omitempty"`
	// Members lists the gateways of the fleet this gateway belongs to
	// (itself included) that take joins, so that a client given one
	// gateway can fail over to the others; empty for a single gateway.
	Members []Member `json:"members,omitempty"`
	// GatewayVersion is the gateway's airlock version (the server fills
	// it in from ServerConfig.Version).
	GatewayVersion string `json:"gateway_version,omitempty"`
}

// Member is one gateway of a fleet: the HOST:PORT clients dial and its
// pin. A client trusts the pins a gateway it pinned vouches for.
type Member struct {
	Gateway string `json:"gateway"`
	// Pin is the gateway's pin, or during its key rotation its next and
	// current pins separated by "|" (ParsePins).
	Pin string `json:"pin"`
}

// LeaseRef names a lease in renew and release requests.
type LeaseRef struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
	// From is where the request came from, set by the server (never from
	// the wire): a token's source networks and an attested node are
	// checked at every request for the lease, not only at join.
	From netip.AddrPort `json:"-"`
}

// RenewResponse is the answer to a successful renew.
type RenewResponse struct {
	Expires time.Time `json:"expires"`
}

// Health is the gateway's load report, served without authentication.
type Health struct {
	Jobs     int  `json:"jobs"`
	Draining bool `json:"draining"`
	// Capacity is how many jobs the gateway can hold (0: unknown, an
	// older gateway); clients spread joins in proportion to the free
	// capacity Capacity - Jobs.
	Capacity int `json:"capacity,omitempty"`
	// RxBitsPerSec and TxBitsPerSec are the WireGuard traffic the gateway
	// received from and sent to jobs, averaged over the last few seconds.
	RxBitsPerSec float64 `json:"rx_bits_per_sec"`
	TxBitsPerSec float64 `json:"tx_bits_per_sec"`
	// Instance changes every time the gateway process starts: a client
	// that sees it change knows the gateway lost its WireGuard sessions.
	Instance string `json:"instance,omitempty"`
	// Attest is "munge" when the gateway verifies MUNGE credentials
	// (attested identity), so that a client makes one only for gateways
	// that check it; empty otherwise.
	Attest string `json:"attest,omitempty"`
	// Bearer reports that the gateway takes jobs' bearer tokens (it
	// trusts an issuer), so that a client sends one only where it is
	// checked.
	Bearer bool `json:"bearer,omitempty"`
}

// Error codes carried in [ErrorResponse.Code].
const (
	CodeBadRequest   = "bad_request"
	CodeBadToken     = "bad_token"
	CodeRateLimited  = "rate_limited"
	CodeNoAddress    = "no_address"
	CodeUnknownLease = "unknown_lease"
	// CodeLeaseEnded answers a renew of a lease the gateway ended on
	// purpose (airlock kick); the message says why.
	CodeLeaseEnded = "lease_ended"
	CodeInternal   = "internal"
	// CodeDraining answers a join while the gateway drains.
	CodeDraining = "draining"
	// CodeQuota answers a join over one of its token's quotas (leases at
	// once, joins per minute); the message names the quota.
	CodeQuota = "quota_exceeded"
	// CodeBanned answers a join from a token and host that an admin
	// banned (airlock kick --ban); the message says for how long.
	CodeBanned = "banned"
	// CodeKeyInUse answers a join whose public key holds a live lease
	// that the join does not prove it holds (JoinRequest.Replace).
	CodeKeyInUse = "key_in_use"
	// CodeVersionUnsupported answers a join from a client older than the
	// gateway serves (HTTP 426); the message names both versions. Final:
	// the client must be upgraded, not retried.
	CodeVersionUnsupported = "version_unsupported"
	// CodeBadTicket answers a relayed capture (PathFleetCapture) whose
	// ticket the gateway must not serve; CodeNoSuchCapture one whose job
	// it does not hold (relay.go).
	CodeBadTicket     = "bad_ticket"
	CodeNoSuchCapture = "no_such_capture"
	// CodeBusy answers a request the gateway has no time for now; its
	// Retry-After says when to ask again.
	CodeBusy = "busy"
	// CodeStoreUnavailable answers a join that a fail-closed member of a
	// fleet cannot check while its database is unreachable (HTTP 503 with
	// Retry-After); the message says so. Not final: retry, or use another
	// gateway.
	CodeStoreUnavailable = "store_unavailable"
)

// ErrorResponse is the body of every non-2xx response.
type ErrorResponse struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Duration is a time.Duration that marshals to JSON as a string such as
// "30s".
type Duration time.Duration
