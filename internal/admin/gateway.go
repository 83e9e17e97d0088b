// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/httpjson"
)

// The running gateway's endpoints (registered by SetGateway):
//
//	GET  /v1/status                       → Status
//	GET  /v1/flows?job=ID&active=1        → FlowList
//	POST /v1/kick {"job","reason","ban"}  → KickResult
//	POST /v1/drain {"drain"}              → DrainResponse
//	POST /v1/reload                       → ReloadResult
//	GET  /v1/capture?job=ID&filter=F      → pcap stream

// Gateway is the running gateway as the admin API sees it: what it knows
// and the few things an admin may do to it. The admin API's logic (which
// lease a job name means, bans, revocations, drain, the capture request)
// lives in this package; the gateway only answers these calls. Its
// methods are called concurrently from request goroutines.
type Gateway interface {
	// Status returns the gateway's status.
	Status() Status
	// Flows returns the flows matching f; recent too unless activeOnly.
	Flows(f flows.Filter, activeOnly bool) FlowList
	// Leases returns the live leases.
	Leases() []LiveLease
	// EndLease ends lease id as if it had expired, on the order of the
	// admin command by, and records why in the history; its client is
	// told at once, and at any later request, with reason. It reports
	// false if the lease ended meanwhile.
	EndLease(id, by, reason, why string) (KickedLease, bool)
	// Ban refuses joins from l's token and host (and its client's
	// network) for d and returns when the ban ends and, for the admin,
	// what it covers.
	Ban(l LiveLease, d time.Duration, reason string) (until time.Time, covers string)
	// SetDraining makes the gateway refuse new joins (on) or take them
	// again, and returns the previous setting.
	SetDraining(on bool) (was bool)
	// Reload loads the config file again and puts it in force; on error
	// the old config stays and the error names file, line and key.
	Reload() (ReloadResult, error)
	// StartCapture attaches a live capture tap, selected by f, to the
	// leases ids (ending with them) and returns it and a function that
	// detaches it; the error wraps ErrBadCapture if the request is
	// invalid.
	StartCapture(ids []string, req CaptureRequest, f *capture.Filter) (*capture.Tap, func(), error)
}

// LiveLease is a live lease as the admin API matches and reports it. The
// job's fields come from its client: escape them before printing.
type LiveLease struct {
	ID string
	// Addrs are the job's tunnel addresses, its first one first.
	Addrs []netip.Addr
	JobID string
	Host  string
	User  string
	Token string
	Start time.Time
	// JobAttested reports that JobID was attested by root on the node
	// (a MUNGE job credential), not only claimed by the job's client;
	// Attested is the lease's attested identity, nil if none.
	JobAttested bool
	Attested    *identity.Attestation
	// Issued is the lease's issuer-verified identity, nil if none.
	Issued *identity.Issued
}

// Addr returns the job's first tunnel address.
func (l LiveLease) Addr() netip.Addr {
	if len(l.Addrs) == 0 {
		return netip.Addr{}
	}
	return l.Addrs[0]
}

// DrainRequest is the body of POST /v1/drain.
type DrainRequest struct {
	// Drain true stops new joins; false takes joins again.
	Drain bool `json:"drain"`
}

// DrainResponse answers POST /v1/drain.
type DrainResponse struct {
	Draining bool `json:"draining"`
	// Jobs is the number of live leases, which draining leaves alone.
	Jobs int `json:"jobs"`
}

// DrainPath is the admin endpoint of drain.
const DrainPath = "/v1/drain"

// SetGateway registers the endpoints of the running gateway, answered by
// g. Call it once, before serving.
func (s *Server) SetGateway(g Gateway) {
	s.mu.Lock()
	s.gw = g
	s.mu.Unlock()
	s.mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusOK, g.Status())
	})
	s.mux.HandleFunc("GET /v1/flows", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		active := false
		if v := q.Get("active"); v != "" {
			var err error
			if active, err = strconv.ParseBool(v); err != nil {
				httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: fmt.Sprintf("bad active %q: want true or false", v)})
				return
			}
		}
		httpjson.Write(w, http.StatusOK, g.Flows(flows.Filter{Job: q.Get("job")}, active))
	})
	s.mux.HandleFunc("POST /v1/kick", func(w http.ResponseWriter, r *http.Request) { s.handleKick(w, r, g) })
	s.mux.HandleFunc("POST "+DrainPath, func(w http.ResponseWriter, r *http.Request) { s.handleDrain(w, r, g) })
	s.mux.HandleFunc("POST "+ReloadPath, func(w http.ResponseWriter, r *http.Request) {
		res, err := g.Reload()
		if err != nil {
			httpjson.Write(w, http.StatusBadRequest, errorBody{Code: CodeBadConfig, Message: err.Error()})
			return
		}
		httpjson.Write(w, http.StatusOK, res)
	})
	s.mux.HandleFunc("GET "+CapturePath, func(w http.ResponseWriter, r *http.Request) { s.handleCapture(w, r, g) })
}

// gateway returns the running gateway, nil if none is set.
func (s *Server) gateway() Gateway {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gw
}

func (s *Server) handleKick(w http.ResponseWriter, r *http.Request, g Gateway) {
	var req KickRequest
	if err := decodeBody(w, r, &req); err != nil {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: "bad kick request: " + err.Error()})
		return
	}
	if req.Job == "" {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: "kick: no job given; want a batch job id, lease id or tunnel address (airlock status lists them)"})
		return
	}
	var ban time.Duration
	if req.Ban != "" {
		d, err := time.ParseDuration(req.Ban)
		if err != nil || d <= 0 {
			httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: fmt.Sprintf("kick: bad ban %q: want a positive duration such as 30m or 24h", req.Ban)})
			return
		}
		ban = d
	}
	res, err := kick(g, req, ban)
	if errors.Is(err, ErrNoSuchJob) {
		// Not here: the fleet's gateway that holds it, if any.
		if fres, ferr := s.fleetKick(r.Context(), req, ban); !errors.Is(ferr, fleet.ErrNoSuchJob) {
			res, err = fres, ferr
		}
	}
	switch {
	case errors.Is(err, ErrNoSuchJob):
		httpjson.Write(w, http.StatusNotFound, errorBody{Code: codeNoSuchJob, Message: err.Error()})
	case errors.Is(err, ErrAmbiguousJob):
		httpjson.Write(w, http.StatusConflict, errorBody{Code: codeAmbiguousJob, Message: err.Error()})
	case err != nil:
		s.log.Error("kick failed", "job", req.Job, "err", err)
		httpjson.Write(w, http.StatusInternalServerError, errorBody{Code: codeInternal, Message: err.Error()})
	default:
		k := res.Kicked[0]
		s.log.Warn("job kicked by admin: lease ended", "lease", k.Lease, "addr", k.Addr, "job", k.JobID, "reason", req.Reason, "ban", ban)
		httpjson.Write(w, http.StatusOK, res)
	}
}

// kick ends the lease whose id or tunnel address is req.Job, else the one
// lease whose batch job id is req.Job (refusing, with a list, when several
// claim it: batch job ids come from the clients). With ban > 0, joins from
// the job's token and host are refused for that long.
func kick(g Gateway, req KickRequest, ban time.Duration) (KickResult, error) {
	var res KickResult
	l, err := oneLease(g, req.Job, "kick")
	if err != nil {
		return res, err
	}
	why := "kicked by admin"
	if req.Reason != "" {
		why += ": " + req.Reason
	}
	if ban > 0 {
		res.BannedUntil, res.BanCovers = g.Ban(l, ban, req.Reason)
	}
	k, ok := g.EndLease(l.ID, "airlock kick", req.Reason, why)
	if !ok {
		return res, fmt.Errorf("%w %q: its lease ended meanwhile", ErrNoSuchJob, req.Job)
	}
	res.Kicked = append(res.Kicked, k)
	return res, nil
}

// leasesOf returns the live leases job names: the one whose lease id or
// tunnel address it is, else all whose batch job id it is; ErrNoSuchJob if
// none.
func leasesOf(g Gateway, job string) ([]LiveLease, error) {
	var byID, byBatch, attested []LiveLease
	for _, l := range g.Leases() {
		switch {
		case l.ID == job || slices.ContainsFunc(l.Addrs, func(a netip.Addr) bool { return a.String() == job }):
			byID = append(byID, l)
		case l.JobID != "" && l.JobID == job:
			byBatch = append(byBatch, l)
			if l.JobAttested {
				attested = append(attested, l)
			}
		}
	}
	// Lease ids and addresses are unique; an attested batch job id wins
	// over claimed ones (a job cannot hide behind, or be mistaken for,
	// another job's attested id).
	match := byID
	if len(match) == 0 {
		match = attested
	}
	if len(match) == 0 {
		match = byBatch
	}
	if len(match) == 0 {
		return nil, fmt.Errorf("%w %q: no live lease has that batch job id, lease id or tunnel address (airlock status lists them)", ErrNoSuchJob, job)
	}
	return match, nil
}

// oneLease is the one live lease job names (a lease id, a tunnel address,
// or a batch job id that exactly one live lease has), for an admin
// command (op: kick, capture) that must act on one job: batch job ids come
// from the clients, so one that several leases claim is refused
// (ErrAmbiguousJob) with the list, to act on by lease id or address.
func oneLease(g Gateway, job, op string) (LiveLease, error) {
	match, err := leasesOf(g, job)
	if err != nil {
		return LiveLease{}, err
	}
	if len(match) > 1 {
		var list []string
		for _, l := range match {
			list = append(list, fmt.Sprintf("lease %s at %s (host %q, user %q, token %s, since %s)",
				l.ID, l.Addr(), l.Host, l.User, l.Token, l.Start.UTC().Format(time.RFC3339)))
		}
		return LiveLease{}, fmt.Errorf("%w: %d live leases claim batch job id %q; %s one by its lease id or tunnel address: %s",
			ErrAmbiguousJob, len(match), job, op, strings.Join(list, "; "))
	}
	return match[0], nil
}

// endTokenLeases ends every live lease of the token named, as a kick
// does, when the token is revoked.
func (s *Server) endTokenLeases(g Gateway, name, reason string) []KickedLease {
	out := []KickedLease{}
	for _, l := range g.Leases() {
		if l.Token != name {
			continue
		}
		if k, ok := g.EndLease(l.ID, "airlock token revoke", reason, reason); ok {
			s.log.Warn("token revoked: lease ended", "lease", l.ID, "addrs", l.Addrs, "token", name)
			out = append(out, k)
		}
	}
	return out
}

func (s *Server) handleDrain(w http.ResponseWriter, r *http.Request, g Gateway) {
	var req DrainRequest
	if err := decodeBody(w, r, &req); err != nil {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: "drain: want {\"drain\": true|false}: " + err.Error()})
		return
	}
	was := g.SetDraining(req.Drain)
	jobs := len(g.Leases())
	if was != req.Drain {
		if req.Drain {
			s.log.Warn("draining: new joins are refused, running jobs continue", "jobs", jobs)
		} else {
			s.log.Info("drain ended: taking new jobs again")
		}
	}
	httpjson.Write(w, http.StatusOK, DrainResponse{Draining: req.Drain, Jobs: jobs})
}

// Drain makes the gateway refuse new joins (on) or take them again.
func (c *Client) Drain(ctx context.Context, on bool) (DrainResponse, error) {
	var res DrainResponse
	if err := c.do(ctx, http.MethodPost, DrainPath, DrainRequest{Drain: on}, &res); err != nil {
		return DrainResponse{}, err
	}
	return res, nil
}
