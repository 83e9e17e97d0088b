// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-vpn/airlock/internal/fleet"
)

// FleetPath is the admin endpoint of airlock status --fleet (registered by
// a gateway in a fleet).
const FleetPath = "/v1/fleet"

// fleetKickTimeout bounds the wait for the answer of the gateway that
// holds a kicked job.
const fleetKickTimeout = 5 * time.Second

// SetFleet makes kicks of jobs that this gateway does not hold go to the
// fleet's gateway that does (through the shared database); nil: a single
// gateway. Call it before serving.
func (s *Server) SetFleet(n *fleet.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fleet = n
}

// fleetKick kicks job on whichever gateway of the fleet holds it.
func (s *Server) fleetKick(ctx context.Context, req KickRequest, ban time.Duration) (KickResult, error) {
	s.mu.Lock()
	n := s.fleet
	s.mu.Unlock()
	if n == nil {
		return KickResult{}, fleet.ErrNoSuchJob
	}
	r, res, err := fleet.Kick(ctx, n.Remote(), req.Job, req.Reason, ban, "airlock kick", fleetKickTimeout)
	switch {
	case errors.Is(err, fleet.ErrNoSuchJob):
		return KickResult{}, fmt.Errorf("%w: %w", ErrNoSuchJob, err)
	case errors.Is(err, fleet.ErrAmbiguousJob):
		return KickResult{}, fmt.Errorf("%w: %w", ErrAmbiguousJob, err)
	case err != nil:
		return KickResult{}, err
	case !res.Ended:
		return KickResult{}, fmt.Errorf("%w %q: gateway %s: %s", ErrNoSuchJob, req.Job, r.Gateway, res.Error)
	}
	out := KickResult{Kicked: []KickedLease{{Lease: r.ID, JobID: r.JobID, Addr: r.TunnelAddr(), Token: r.Token, Host: r.Host, Gateway: r.Gateway}}}
	if ban > 0 {
		out.BannedUntil = time.Now().Add(ban)
	}
	return out, nil
}

// WriteJSON writes v as the JSON answer with status, for endpoints
// registered with Handle.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

// WriteError writes an admin error answer.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, errorBody{Code: code, Message: msg})
}
