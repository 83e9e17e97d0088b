// SPDX-License-Identifier: MIT

package control

import "golang.org/x/time/rate"

// DisableSessions makes s answer lease session upgrades as a gateway that
// predates them does (404 bad_request), for tests of clients against such
// gateways.
func DisableSessions(s *Server) { s.noSessions.Store(true) }

// SetSourceRequestLimit replaces the request budget that the lease
// sessions of one source share (conns.go), for tests that exhaust it.
func SetSourceRequestLimit(s *Server, r float64, burst int) {
	s.srcReqs = newSourceRequests(rate.Limit(r), burst)
}
