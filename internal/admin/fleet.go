// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/httpjson"
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
func WriteJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v) }

// WriteError writes an admin error answer.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	httpjson.Write(w, status, errorBody{Code: code, Message: msg})
}

// fleetCaptureTimeout bounds the connection to the gateway that holds a
// relayed capture's job and the wait for its answer.
const fleetCaptureTimeout = 10 * time.Second

// relayCapture serves req, a live capture of a job that another gateway
// of the fleet holds, relayed from that gateway (fleet.Capture). It
// reports false, having written nothing, when this gateway is in no fleet
// or no gateway of the fleet holds the job.
func (s *Server) relayCapture(w http.ResponseWriter, r *http.Request, req CaptureRequest) bool {
	s.mu.Lock()
	n := s.fleet
	s.mu.Unlock()
	if n == nil {
		return false
	}
	body, l, gw, err := n.Capture(r.Context(), fleet.CaptureRequest{Job: req.Job, Filter: req.Filter, Snaplen: req.Snaplen, Buffer: req.Buffer}, fleetCaptureTimeout)
	switch {
	case errors.Is(err, fleet.ErrNoSuchJob):
		return false
	case errors.Is(err, fleet.ErrAmbiguousJob):
		httpjson.Write(w, http.StatusConflict, errorBody{Code: codeAmbiguousJob, Message: err.Error()})
		return true
	case err != nil:
		httpjson.Write(w, http.StatusBadGateway, errorBody{Code: codeInternal, Message: fmt.Sprintf("capture %s through the fleet: %v", req.Job, err)})
		return true
	}
	defer body.Close()
	start := time.Now()
	s.log.Info("live capture relayed from the fleet started", "job", req.Job, "lease", l.ID, "gateway", gw.Advertise, "filter", req.Filter)
	w.Header().Set("Content-Type", "application/vnd.tcpdump.pcap")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	buf := make([]byte, 64<<10)
	for {
		k, rerr := body.Read(buf)
		if k > 0 {
			if _, err = w.Write(buf[:k]); err != nil {
				break
			}
			_ = rc.Flush()
		}
		if rerr != nil {
			if rerr != io.EOF {
				err = rerr
			}
			break
		}
	}
	if r.Context().Err() != nil {
		err = r.Context().Err()
	}
	s.log.Info("live capture relayed from the fleet ended", "job", req.Job, "gateway", gw.Advertise, "duration", time.Since(start).Round(time.Millisecond), "why", captureEnd(err))
	return true
}
