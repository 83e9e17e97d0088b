package main

import (
	"fmt"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/preflight"
)

// ipv6Checks are airlock gateway --check's IPv6 lines for a user-mode
// gateway: where jobs' IPv6 flows leave from, and --egress-prefix6's local
// route.
func ipv6Checks(cfg gateway.Config) []preflight.Result {
	if cfg.Egress == gateway.EgressKernel || cfg.NoIPv6 {
		return nil
	}
	var out []preflight.Result
	switch {
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
