// SPDX-License-Identifier: MIT

package control

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"time"
)

// Lease-authenticated requests and the failure limiter: a source network
// whose failure bucket is empty (failures.go) gets every join refused up
// front. Requests that name a lease are different: a batch node's jobs
// share its address with whoever else runs there, and refusing their
// renewals because a neighbour sent bad tokens would let any local user
// take every job's lease down. So renew, release, watch and tunnel
// requests are always decoded and checked; only when they fail (malformed,
// or no live lease with that id and secret) does a limited source get
// 429, without the failure being counted again. Lease secrets are 192
// random bits, so looking at them while limited gives a guesser nothing.

// limit is a source network's failure-limiter state when a request came.
type limit struct {
	on   bool          // the bucket is empty: unauthenticated requests are refused
	wait time.Duration // until the next one is allowed
}

// limitOf returns remote's limiter state now.
func (s *Server) limitOf(remote netip.AddrPort) limit {
	wait, on := s.fails.limited(peerKey(remote.Addr()), s.now())
	return limit{on: on, wait: wait}
}

// refuseLimited answers 429 with Retry-After and logs (rate-limited).
func (s *Server) refuseLimited(w http.ResponseWriter, r *http.Request, remote netip.AddrPort, wait time.Duration) {
	secs := max(1, int64(math.Ceil(wait.Seconds())))
	err := WithRetryAfter(fmt.Errorf("%w: too many failed requests from your address; retry in %d s, after fixing the token or request", ErrRateLimited, secs), wait)
	s.refuse(w, r.URL.Path, remote, err)
}

// leaseError answers err to a request that names a lease: a limited source
// whose request proved no live lease gets 429, without the failure being
// counted again.
func (s *Server) leaseError(w http.ResponseWriter, r *http.Request, lim limit, op string, remote netip.AddrPort, err error) {
	if lim.on && (errors.Is(err, ErrUnknownLease) || errors.Is(err, ErrBadRequest)) {
		s.refuseLimited(w, r, remote, lim.wait)
		return
	}
	s.refuse(w, op, remote, err)
}
