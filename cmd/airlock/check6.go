// SPDX-License-Identifier: MIT

package main

import (
	"cmp"
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlock-vpn/airlock/internal/forward/kernel"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/preflight"
)

// ipv6Checks are airlock gateway --check's IPv6 lines: where jobs' IPv6
// flows leave from, and --egress-prefix6's host setup (user mode: a local
// route; kernel mode: no local route, not on-link elsewhere).
func ipv6Checks(cfg gateway.Config) []preflight.Result {
	if cfg.NoIPv6 {
		return nil
	}
	var out []preflight.Result
	switch {
	case cfg.EgressPrefix6.IsValid() && cfg.Egress == gateway.EgressKernel:
		r := preflight.Result{Name: "egress prefix6", Status: preflight.OK, Detail: fmt.Sprintf("%s is routed to the TUN: jobs' IPv6 flows leave from their own addresses (the site must route it to this host)", cfg.EgressPrefix6)}
		if msgs := kernel.CheckPrefix6(cfg.EgressPrefix6, cmp.Or(cfg.TUN, kernel.DefaultName)); len(msgs) > 0 {
			r.Status, r.Detail = preflight.Problem, strings.Join(msgs, "; ")
		}
		out = append(out, r)
	case cfg.EgressPrefix6.IsValid():
		r := preflight.Result{Name: "egress prefix6", Status: preflight.OK, Detail: fmt.Sprintf("%s is a local route: jobs' IPv6 flows leave from their own addresses", cfg.EgressPrefix6)}
		if err := gateway.CheckLocalPrefix6(cfg.EgressPrefix6, netip.Addr{}); err != nil {
			r = preflight.Result{Name: "egress prefix6", Status: preflight.Problem, Detail: err.Error(),
				Fix: fmt.Sprintf("as root: ip -6 route add local %s dev lo", cfg.EgressPrefix6)}
		}
		out = append(out, r)
	case cfg.EgressAddr6.IsValid():
	default:
		r := preflight.Result{Name: "ipv6 egress", Status: preflight.OK}
		if a, err := gateway.IPv6EgressSource(); err != nil {
			r.Status, r.Detail = preflight.Warn, fmt.Sprintf("jobs get IPv4 only: %v", err)
			r.Fix = "give this host an IPv6 default route, or set --egress-addr6"
		} else {
			r.Detail = fmt.Sprintf("jobs' IPv6 flows leave from %s (the IPv6 default route's source)", a)
		}
		out = append(out, r)
	}
	return out
}
