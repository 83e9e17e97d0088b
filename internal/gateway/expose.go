package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// errNoExposure is wrapped by allocExposures' errors; they are the
// client's fault (bad request), never the gateway's.
var errNoExposure = errors.New("cannot expose")

// maxExposures returns how many ports a job with block may expose: a
// quarter of the block, so that most of it stays for the job's outgoing
// connections.
func maxExposures(block portblock.Range) int { return block.Len() / 4 }

// allocExposures maps each requested port to a public port of the job's
// block, from the top down (block.Hi, block.Hi-1, ...), so that the ports
// an exposure takes are predictable and the bottom of the block, where
// outgoing connections start, stays free. Duplicates, more requests than
// maxExposures, and any request when the lease has no block are refused.
func allocExposures(block portblock.Range, reqs []control.Port) ([]forward.Exposure, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if block == (portblock.Range{}) {
		return nil, fmt.Errorf("%w: this gateway gives jobs no port block", errNoExposure)
	}
	if n := maxExposures(block); len(reqs) > n {
		return nil, fmt.Errorf("%w %d ports: a job may expose at most %d (a quarter of its %d-port block)",
			errNoExposure, len(reqs), n, block.Len())
	}
	seen := make(map[control.Port]bool, len(reqs))
	out := make([]forward.Exposure, 0, len(reqs))
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", errNoExposure, err)
		}
		if seen[r] {
			return nil, fmt.Errorf("%w %s twice", errNoExposure, r)
		}
		seen[r] = true
		out = append(out, forward.Exposure{Proto: r.Proto, JobPort: r.Port, PublicPort: block.Hi - uint16(i)})
	}
	return out, nil
}

// exposeAddr returns the public address announced for jobs' exposed ports:
// the egress address if there is one, else (user mode on every address) the
// host's first global unicast IPv4 address, else its first global unicast
// IPv6 address. It returns the zero Addr if the host has none.
func exposeAddr(eg egress, log *slog.Logger) netip.Addr {
	if !eg.public.IsUnspecified() {
		return eg.public
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		log.Warn("cannot list host addresses; jobs cannot expose ports (set --egress-addr)", "err", err)
		return netip.Addr{}
	}
	var v6 netip.Addr
	for _, ia := range addrs {
		n, ok := ia.(*net.IPNet)
		if !ok {
			continue
		}
		a, ok := netip.AddrFromSlice(n.IP)
		if !ok || !a.Unmap().IsGlobalUnicast() {
			continue
		}
		a = a.Unmap()
		if a.Is4() {
			return a
		}
		if !v6.IsValid() {
			v6 = a
		}
	}
	if !v6.IsValid() {
		log.Warn("this host has no global unicast address; jobs cannot expose ports (set --egress-addr)")
	}
	return v6
}
