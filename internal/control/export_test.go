// SPDX-License-Identifier: MIT

package control

// DisableSessions makes s answer lease session upgrades as a gateway that
// predates them does (404 bad_request), for tests of clients against such
// gateways.
func DisableSessions(s *Server) { s.noSessions.Store(true) }
