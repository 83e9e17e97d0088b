// SPDX-License-Identifier: MIT

package control

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
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
	wait, on := s.fails.limited(remote.Addr(), s.now())
	return limit{on: on, wait: wait}
}

// refuseLimited answers 429 with Retry-After and logs (rate-limited).
func (s *Server) refuseLimited(w http.ResponseWriter, r *http.Request, remote netip.AddrPort, wait time.Duration) {
	secs := int64(math.Ceil(wait.Seconds()))
	if secs < 1 {
		secs = 1
	}
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	writeError(w, http.StatusTooManyRequests, CodeRateLimited,
		fmt.Sprintf("too many failed requests from your address; retry in %d s, after fixing the token or request", secs))
	if s.logLim.Allow() {
		s.log.Warn("control request refused: too many failures", "path", r.URL.Path, "remote", remote, "suppressed", s.suppressed.Swap(0))
	} else {
		s.suppressed.Add(1)
	}
}

// leaseFailed is failed for a lease request: a limited source gets 429
// and the failure is not counted again.
func (s *Server) leaseFailed(w http.ResponseWriter, r *http.Request, lim limit, remote netip.AddrPort, op string, status int, code, msg string, err error) {
	if lim.on {
		s.refuseLimited(w, r, remote, lim.wait)
		return
	}
	s.failed(w, remote, op, status, code, msg, err)
}

// leaseError is backendError for a lease request: a limited source whose
// request proved no live lease gets 429.
func (s *Server) leaseError(w http.ResponseWriter, r *http.Request, lim limit, op string, remote netip.AddrPort, err error) {
	if lim.on && (errors.Is(err, ErrUnknownLease) || errors.Is(err, ErrBadRequest)) {
		s.refuseLimited(w, r, remote, lim.wait)
		return
	}
	s.backendError(w, op, remote, err)
}
