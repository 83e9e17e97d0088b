// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/flows"
)

// Status is the answer to GET /v1/status.
type Status struct {
	// Version is the gateway's version (airlock version).
	Version string `json:"version"`
	// Pin is the fingerprint clients pin; NextPin the next one while a
	// key rotation is under way (airlock gateway rotate-key).
	Pin     string `json:"pin"`
	NextPin string `json:"next_pin,omitempty"`
	// Mode is the egress mode, "user" or "kernel".
	Mode    string    `json:"mode"`
	Started time.Time `json:"started"`
	// UptimeSeconds is the time since Started when the status was made.
	UptimeSeconds float64 `json:"uptime_seconds"`
	// Advertise is the HOST:PORT clients dial.
	Advertise  string      `json:"advertise"`
	EgressAddr netip.Addr  `json:"egress_addr"`
	PortBlocks PortBlocks  `json:"port_blocks"`
	Jobs       []JobStatus `json:"jobs"`
	// Totals are the gateway-wide flow counts since start.
	Totals flows.Stats `json:"totals"`
	// Draining is true while the gateway refuses new joins (airlock
	// gateway drain).
	Draining bool `json:"draining"`
	// Capacity is how many concurrent jobs the gateway can hold and what
	// bounds it.
	Capacity Capacity `json:"capacity"`
	// UDP describes the WireGuard UDP sockets.
	UDP UDPStats `json:"udp"`
}

// UDPStats describes the gateway's WireGuard UDP sockets: the buffers the
// kernel granted (bytes; it asks for 7 MiB each), the datagrams it dropped
// at them since they opened (a full receive queue), and the path MTU
// probes answered and refused.
type UDPStats struct {
	Sockets        int    `json:"sockets"`
	ReceiveBuffer  int    `json:"receive_buffer"`
	SendBuffer     int    `json:"send_buffer"`
	ReceiveDrops   uint64 `json:"receive_drops"`
	ProbesAnswered uint64 `json:"mtu_probes_answered"`
	ProbesRefused  uint64 `json:"mtu_probes_refused"`
}

// Capacity is the gateway's capacity in jobs and its bound, e.g. 110
// jobs, bound by "egress port blocks", widened by Hint.
type Capacity struct {
	Jobs  int    `json:"jobs"`
	Bound string `json:"bound"`
	Hint  string `json:"hint"`
}

// PortBlocks describes the egress port-block plan and its use.
type PortBlocks struct {
	Range string `json:"range"`
	Size  int    `json:"size"`
	Total int    `json:"total"`
	Used  int    `json:"used"`
	Free  int    `json:"free"`
	// Addrs is the number of egress addresses the blocks are drawn from
	// (Total is Addrs × the blocks of Range).
	Addrs int `json:"addrs"`
}

// JobStatus is one job with a live lease.
type JobStatus struct {
	flows.JobStats
	// Host, User and ClaimedUID are what the job's client claimed;
	// Attested, if set, is what its credentials attested (the flow
	// table's Ref says which of JobID and the uid are attested).
	Host       string                `json:"host,omitempty"`
	User       string                `json:"user,omitempty"`
	ClaimedUID int                   `json:"claimed_uid"`
	Attested   *identity.Attestation `json:"attested,omitempty"`
	// Issued, if set, is the identity its bearer token's issuer vouched
	// for (source "issuer-verified").
	Issued  *identity.Issued `json:"issued,omitempty"`
	Remote  string           `json:"remote,omitempty"`
	Started time.Time        `json:"started"`
	Expires time.Time        `json:"expires"`
	// Transport is how the job's WireGuard reaches the gateway: "udp",
	// or "tcp" (the TCP/TLS transport on the control port).
	Transport string `json:"transport"`
	// Ports is the job's egress port block, LO-HI, "" if none.
	Ports string `json:"ports,omitempty"`
	// Addrs are all the job's tunnel addresses (its flows of every
	// family count under Addr, its first).
	Addrs []netip.Addr `json:"addrs,omitempty"`
}

// FlowList is the answer to GET /v1/flows.
type FlowList struct {
	// Active are the open flows.
	Active []flows.Record `json:"active"`
	// Recent are recently ended and refused flows (not with active=1).
	Recent []flows.Record `json:"recent,omitempty"`
}

// KickRequest is the body of POST /v1/kick.
type KickRequest struct {
	// Job is a batch job id, a lease id or a tunnel address.
	Job    string `json:"job"`
	Reason string `json:"reason,omitempty"`
	// Ban, a duration such as "24h", refuses joins from the kicked job's
	// token and host for that long; "" bans nothing.
	Ban string `json:"ban,omitempty"`
}

// KickResult lists the leases a kick ended.
type KickResult struct {
	Kicked []KickedLease `json:"kicked"`
	// BannedUntil is when the ban of KickRequest.Ban ends.
	BannedUntil time.Time `json:"banned_until,omitzero"`
	// BanCovers says what the ban refuses, e.g. `joins of token "cms"
	// from host name "cn1" (any case) or from network 10.1.2.3/32`.
	BanCovers string `json:"ban_covers,omitempty"`
}

// KickedLease is one lease ended by a kick.
type KickedLease struct {
	Lease string     `json:"lease"`
	JobID string     `json:"job_id,omitempty"`
	Addr  netip.Addr `json:"addr"`
	Token string     `json:"token,omitempty"`
	Host  string     `json:"host,omitempty"`
	// Gateway is the advertised address of the fleet's gateway that
	// held the lease, when another than the one asked.
	Gateway string `json:"gateway,omitempty"`
}

// ErrNoSuchJob means no live lease matches a kick.
var ErrNoSuchJob = errors.New("no such job")

// codeNoSuchJob is ErrNoSuchJob's error code.
const codeNoSuchJob = "no_such_job"

// ErrAmbiguousJob means a kick's batch job id names several live leases;
// the message lists them, to be kicked by lease id or address.
var ErrAmbiguousJob = errors.New("ambiguous job")

// codeAmbiguousJob is ErrAmbiguousJob's error code.
const codeAmbiguousJob = "ambiguous_job"

// Status asks the gateway for its status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	if err := c.do(ctx, http.MethodGet, "/v1/status", nil, &st); err != nil {
		return Status{}, fmt.Errorf("status: %w", err)
	}
	return st, nil
}

// Flows asks the gateway for the flows of job ("" for all), only the
// active ones if activeOnly.
func (c *Client) Flows(ctx context.Context, job string, activeOnly bool) (FlowList, error) {
	v := url.Values{}
	if job != "" {
		v.Set("job", job)
	}
	if activeOnly {
		v.Set("active", "true")
	}
	var fl FlowList
	if err := c.do(ctx, http.MethodGet, "/v1/flows?"+v.Encode(), nil, &fl); err != nil {
		return FlowList{}, fmt.Errorf("flows: %w", err)
	}
	return fl, nil
}

// Kick ends the lease req.Job names; the error wraps ErrNoSuchJob if
// none matches, ErrAmbiguousJob if several do.
func (c *Client) Kick(ctx context.Context, req KickRequest) (KickResult, error) {
	var res KickResult
	if err := c.do(ctx, http.MethodPost, "/v1/kick", req, &res); err != nil {
		return KickResult{}, fmt.Errorf("kick %q: %w", req.Job, err)
	}
	return res, nil
}

// decodeBody decodes a size-limited JSON body with no unknown fields.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
