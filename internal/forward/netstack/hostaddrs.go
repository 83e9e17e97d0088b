// SPDX-License-Identifier: MIT

package netstack

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// hostAddrsTTL is how long the list of the host's own addresses is trusted
// before it is read again.
const hostAddrsTTL = 10 * time.Second

// hostAddrs caches the gateway host's own interface addresses, which jobs
// must not reach: services bound to them (an admin web UI, sshd, a metrics
// endpoint) are meant for the host's own network, not for jobs; and the
// prefixes the host routes as local, whose every address reaches a
// service bound to the wildcard address just the same (user mode's
// --egress-prefix needs one: ip -6 route add local PREFIX dev lo). It is
// safe for concurrent use.
type hostAddrs struct {
	list func() ([]netip.Addr, error)
	// local lists the local routes' prefixes; nil means none.
	local func() ([]netip.Prefix, error)

	mu     sync.Mutex
	read   time.Time
	set    map[netip.Addr]struct{}
	routes []netip.Prefix
}

// interfaceAddrs lists the addresses of this network namespace's interfaces.
func interfaceAddrs() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(ifas))
	for _, ia := range ifas {
		if p, err := netip.ParsePrefix(ia.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// contains reports whether a is one of the host's addresses. If the list
// cannot be read, the last good one is used.
func (h *hostAddrs) contains(a netip.Addr, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set == nil || now.Sub(h.read) > hostAddrsTTL {
		if addrs, err := h.list(); err == nil {
			h.set = make(map[netip.Addr]struct{}, len(addrs))
			for _, x := range addrs {
				h.set[x.Unmap()] = struct{}{}
			}
			h.read = now
		}
		if h.local != nil {
			if ps, err := h.local(); err == nil {
				h.routes = ps
			}
		}
	}
	a = a.Unmap()
	if _, ok := h.set[a]; ok {
		return true
	}
	for _, p := range h.routes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
