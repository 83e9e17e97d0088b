// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"fmt"
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

// exposeAddr returns the public address announced for jobs' exposed ports,
// which is also the only address their listeners bind to: the egress
// address. Without one (user mode on a host without a default route and
// without --egress-addr) it returns the zero Addr and jobs cannot expose
// ports: a listener on every address of the host would also answer on its
// loopback and management addresses, where nothing is announced.
func exposeAddr(eg egress) netip.Addr {
	if !eg.public.IsValid() || eg.public.IsUnspecified() {
		return netip.Addr{}
	}
	return eg.public
}
