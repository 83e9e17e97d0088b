// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// The tunnel MTU that follows the path (user mode). A job's lease keeps
// the safe MTU (--mtu, 1420) and offers a larger one, MaxMTU, derived from
// the route to the client (its interface's MTU less WireGuard's overhead),
// with a token for the probe that proves it (tunnel.ProbeMTU; the
// gateway's Bind answers). Packets of that size reach the gateway's kernel
// TCP in its private namespace, whose TUN therefore takes the largest MTU
// offered (the ceiling); segments it sends to a job follow the job's MSS,
// which the job's own TUN MTU sets, so a job that fell back to 1420 gets
// 1420-byte packets. The user-space netstack (UDP, ICMP, DNS and TCP with
// --tcp-stack netstack) keeps --mtu, so what it sends fits every job's
// path. Kernel mode forwards jobs' packets to the outside as they are and
// offers nothing larger than --mtu.

// maxOfferedMTU is the largest tunnel MTU offered: a 64-KiB IPv6 datagram.
const maxOfferedMTU = 65535 - 80

// pathMTU is the gateway's offer of larger tunnel MTUs. The zero value
// offers nothing. It is safe for concurrent use.
type pathMTU struct {
	// floor is --mtu; ceiling the largest MTU offered (floor: none).
	floor, ceiling int
	key            *tunnel.ProbeKey
	// route returns the route's MTU towards an address (tunnel.RouteMTU).
	route func(netip.Addr) (int, error)

	// mu guards routes: route's answers of the last routeCacheTTL. A
	// storm's jobs come from a few nodes, and each lookup opens, connects
	// and closes a socket: 50 µs of a join's gateway CPU in a 2,000-job
	// storm (1.7 %). A stale answer costs nothing unsafe: the client
	// proves the offer with a probe and falls back to --mtu.
	mu     sync.Mutex
	routes map[netip.Addr]routeEntry
}

// routeEntry is a cached route MTU and when it was looked up.
type routeEntry struct {
	mtu int
	at  time.Time
}

// routeCacheTTL is how long a route's MTU is reused; routeCacheMax bounds
// the cache (it is emptied when full).
const (
	routeCacheTTL = 10 * time.Second
	routeCacheMax = 4096
)

// routeMTU returns route's answer for remote at now, cached; errors are
// not cached.
func (p *pathMTU) routeMTU(remote netip.Addr, now time.Time) (int, error) {
	p.mu.Lock()
	e, ok := p.routes[remote]
	p.mu.Unlock()
	if ok && now.Sub(e.at) >= 0 && now.Sub(e.at) < routeCacheTTL {
		return e.mtu, nil
	}
	m, err := p.route(remote)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	if p.routes == nil || len(p.routes) >= routeCacheMax {
		p.routes = make(map[netip.Addr]routeEntry)
	}
	p.routes[remote] = routeEntry{mtu: m, at: now}
	p.mu.Unlock()
	return m, nil
}

// newPathMTU returns the offer of a gateway with cfg in egress mode mode.
func newPathMTU(cfg Config, mode string) (*pathMTU, error) {
	p := &pathMTU{floor: cfg.MTU, ceiling: cfg.MTU, route: tunnel.RouteMTU}
	if mode == EgressKernel {
		return p, nil
	}
	switch {
	case cfg.MaxMTU > 0:
		p.ceiling = cfg.MaxMTU
	default:
		p.ceiling = max(cfg.MTU, interfacesMTU()-tunnel.Overhead(netip.IPv4Unspecified()))
	}
	p.ceiling = min(p.ceiling, maxOfferedMTU)
	if p.ceiling <= p.floor {
		return p, nil
	}
	k, err := tunnel.NewProbeKey()
	if err != nil {
		return nil, err
	}
	p.key = k
	return p, nil
}

// interfacesMTU returns the largest MTU of the host's interfaces that are
// up, loopback aside (0 if none can be read).
func interfacesMTU() int {
	ifs, err := net.Interfaces()
	if err != nil {
		return 0
	}
	m := 0
	for _, i := range ifs {
		if i.Flags&net.FlagUp != 0 && i.Flags&net.FlagLoopback == 0 {
			m = max(m, i.MTU)
		}
	}
	return m
}

// offer fills in the lease's MaxMTU and MTUProbe for a client whose
// control connection comes from remote; nothing if the route to it carries
// no more than --mtu.
func (p *pathMTU) offer(cl *control.Lease, remote netip.Addr, now time.Time) {
	if p == nil || p.key == nil || !remote.IsValid() {
		return
	}
	r, err := p.routeMTU(remote, now)
	if err != nil {
		return
	}
	m := min(p.ceiling, r-tunnel.Overhead(remote))
	if m <= p.floor {
		return
	}
	cl.MaxMTU, cl.MTUProbe = m, p.key.Token(now)
}

// checkMaxMTU validates --max-mtu against --mtu.
func checkMaxMTU(mtu, maxMTU int) error {
	if maxMTU == 0 {
		return nil
	}
	if maxMTU < mtu || maxMTU > maxOfferedMTU {
		return fmt.Errorf("gateway: --max-mtu %d out of range %d (--mtu: offer no more) to %d (0: derived from the route to each client)", maxMTU, mtu, maxOfferedMTU)
	}
	return nil
}
