package client

import (
	"context"
	"net/netip"
)

// ResolveEndpoint resolves a lease's WireGuard endpoint (HOST:PORT) as
// airlock run does: an empty or unspecified host means the host of the
// control address controlAddr, and IPv4 is preferred.
func ResolveEndpoint(ctx context.Context, endpoint, controlAddr string) (netip.AddrPort, error) {
	return resolveEndpoint(ctx, endpoint, controlAddr)
}
