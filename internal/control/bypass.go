// SPDX-License-Identifier: MIT

package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/ipproto"
)

// Site-local bypass on the wire. The gateway's admin lists destinations
// inside the site (`[[bypass]]` in the gateway's config) that jobs reach
// from the compute node's own network instead of through the gateway, and
// domains whose names the node's site resolver answers. The gateway sends
// the entries that apply to a job's token in the lease (Lease.Bypass) and,
// after a reload, in the lease watch (WatchEvent.Bypass); the client
// carries those flows itself and reports what it carried at every renewal
// (RenewRequest.Bypass). Only the gateway writes the list: nothing the job
// sends adds to it.

// Bypass is the site-local bypass of one job. The zero value bypasses
// nothing.
type Bypass struct {
	// Rules are the destinations the job reaches from the node, each
	// with Action empty. A flow matches a rule if its destination is in
	// one of To and its protocol and port match.
	Rules []Rule `json:"rules"`
	// LocalDomains are DNS suffixes ("site.example") whose names the
	// client resolves through Resolvers from the node.
	LocalDomains []string `json:"local_domains,omitempty"`
	// Resolvers are the site resolvers for LocalDomains.
	Resolvers []netip.AddrPort `json:"resolvers,omitempty"`
	// Policy is the gateway's egress policy as it applies to this job's
	// token: a bypassed flow must also be allowed by it.
	Policy Policy `json:"policy"`
}

// Rule is a policy rule or a bypass entry on the wire.
type Rule struct {
	Name string `json:"name"`
	// Action is "allow" or "deny" in a Policy, empty in Bypass.Rules.
	Action string         `json:"action,omitempty"`
	To     []netip.Prefix `json:"to,omitempty"`
	// Proto is "tcp", "udp", "icmp" or "" (any) on the wire.
	Proto ipproto.Proto `json:"proto,omitempty"`
	// Ports are inclusive destination port ranges; none means every port.
	Ports [][2]uint16 `json:"ports,omitempty"`
}

// Policy is an egress policy on the wire: ordered rules, first match
// wins, then Default ("allow" or "deny").
type Policy struct {
	Default string `json:"default"`
	Rules   []Rule `json:"rules,omitempty"`
}

// BypassCount is what a client carried for one bypass rule since the job
// started: cumulative counters, so a lost renewal loses nothing.
type BypassCount struct {
	Rule string `json:"rule"`
	// Flows counts connections (TCP) and flows (UDP) opened.
	Flows uint64 `json:"flows"`
	// BytesOut is payload the job sent, BytesIn payload it received.
	BytesOut uint64 `json:"bytes_out"`
	BytesIn  uint64 `json:"bytes_in"`
}

// RenewRequest is the body of a renew: the lease and, optionally, the
// client's bypass counters. A bare LeaseRef is a valid RenewRequest.
type RenewRequest struct {
	LeaseRef
	Bypass []BypassCount `json:"bypass,omitempty"`
	// Bearer is the job's current bearer token, for a lease whose
	// identity came from one (control/bearer.go).
	Bearer string `json:"bearer,omitempty"`
}

// maxBypassCounts bounds the counters a renewal may carry.
const maxBypassCounts = 256

// decodeRenewRequest reads a RenewRequest and checks its counters.
func decodeRenewRequest(r io.Reader) (RenewRequest, error) {
	var req RenewRequest
	if err := decodeJSON(r, &req); err != nil {
		return RenewRequest{}, err
	}
	if req.ID == "" || req.Secret == "" {
		return RenewRequest{}, errors.New("missing lease id or secret")
	}
	if err := checkBypassCounts(req.Bypass); err != nil {
		return RenewRequest{}, err
	}
	if err := checkBearer("bearer", req.Bearer); err != nil {
		return RenewRequest{}, err
	}
	return req, nil
}

// checkBypassCounts checks a renewal's bypass counters: at most
// maxBypassCounts, with distinct rule names of 1 to 64 characters.
func checkBypassCounts(counts []BypassCount) error {
	if len(counts) > maxBypassCounts {
		return fmt.Errorf("%d bypass counters: at most %d", len(counts), maxBypassCounts)
	}
	seen := make(map[string]bool, len(counts))
	for _, c := range counts {
		if c.Rule == "" || len(c.Rule) > 64 || seen[c.Rule] {
			return fmt.Errorf("bypass counter rule %q: want distinct names of 1 to 64 characters", truncate(c.Rule, 70))
		}
		seen[c.Rule] = true
	}
	return nil
}

// RenewReport renews a lease like Renew and reports the client's bypass
// counters with it.
func (c *Client) RenewReport(ctx context.Context, req RenewRequest) (RenewResponse, error) {
	var resp RenewResponse
	err := c.do(ctx, "renew", http.MethodPost, PathRenew, req, &resp, true)
	return resp, err
}
