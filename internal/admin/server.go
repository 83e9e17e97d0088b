// SPDX-License-Identifier: MIT

// Package admin implements the gateway's local admin interface: HTTP over
// a unix socket DIR/admin.sock (mode 0600, in the 0700 state directory), so
// that only the gateway's user can manage it and nothing is exposed to the
// network. Admin commands (`airlock token ...`) use [Client]; the
// package-level token functions also work when no gateway runs, by opening
// the state database directly.
//
// API (JSON bodies, errors as {"code","message"}):
//
//	GET    /v1/tokens          → [store.Token]
//	POST   /v1/tokens          {"name","ttl"} → {"secret","token"}
//	DELETE /v1/tokens/{name}   → RevokeResult (ends its live leases)
//	GET    /v1/whois?addr=IP&port=N&at=RFC3339 → [store.LeaseRecord]
//	GET    /v1/status          → Status               (SetGateway)
//	GET    /v1/flows?job=ID&active=true → FlowList    (SetGateway)
//	POST   /v1/kick            {"job","reason","ban"} → KickResult (SetGateway)
//	POST   /v1/drain           {"drain"} → DrainResponse (SetGateway)
//	POST   /v1/reload          → ReloadResult         (SetGateway)
//	GET    /v1/capture?job=ID&filter=F → pcap stream  (SetGateway)
//	GET    /debug/pprof/...    → Go runtime profiles (net/http/pprof)
//
// The running gateway implements the narrow [Gateway] interface; which
// lease a job name means, kicks, bans, revocations, drain, reload and
// capture requests are handled here.
package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/httpjson"
	"github.com/airlock-vpn/airlock/internal/store"
)

// SocketName is the admin socket's file name inside the state directory.
const SocketName = "admin.sock"

// Error codes of admin API error responses.
const (
	codeBadRequest   = "bad_request"
	codeInvalidName  = "invalid_name"
	codeNotFound     = "not_found"
	codeExists       = "exists"
	codeNotPermitted = "not_permitted"
	codeInternal     = "internal"
)

// errorBody is the body of every non-2xx admin response.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// createTokenRequest is the body of POST /v1/tokens.
type createTokenRequest struct {
	// Name is the token's name; empty means generated.
	Name string `json:"name,omitempty"`
	// TTL is a time.ParseDuration string; empty or "0s" means never
	// expires.
	TTL string `json:"ttl,omitempty"`
	// Secret, if set, is an existing token to store (made by another
	// gateway) instead of a new random one.
	Secret string `json:"secret,omitempty"`
}

// createTokenResponse is the answer to POST /v1/tokens.
type createTokenResponse struct {
	Secret string      `json:"secret"`
	Token  store.Token `json:"token"`
}

// Server serves the admin API on a unix socket. Create it with
// [NewServer]; it is safe for concurrent use.
type Server struct {
	log   *slog.Logger
	store store.DB
	mux   *http.ServeMux
	http  *http.Server

	mu     sync.Mutex
	closed bool
	gw     Gateway     // guarded by mu: set by SetGateway, nil without a running gateway
	fleet  *fleet.Node // guarded by mu: set by SetFleet, nil for a single gateway
}

// RevokeResult answers DELETE /v1/tokens/{name}.
type RevokeResult struct {
	// Ended are the token's leases that the revocation ended.
	Ended []KickedLease `json:"ended"`
}

// NewServer returns an admin server for st with the token handlers
// registered. It does not listen: call Serve.
func NewServer(logger *slog.Logger, st store.DB) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{log: logger, store: st, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /v1/tokens", s.handleListTokens)
	s.mux.HandleFunc("POST /v1/tokens", s.handleCreateToken)
	s.mux.HandleFunc("DELETE /v1/tokens/{name}", s.handleRevokeToken)
	s.mux.HandleFunc("PUT /v1/tokens/{name}/restrictions", s.handleRestrictToken)
	s.mux.HandleFunc("GET /v1/whois", s.handleWhois)
	// The runtime's profiles (CPU, heap, goroutines), for measuring the
	// gateway where it runs; only the gateway's user reaches the socket.
	s.mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	s.mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	s.mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	s.http = &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	return s
}

// Handle registers h for pattern (net/http.ServeMux syntax, e.g.
// "GET /v1/status"), so that other parts of the gateway can add admin
// endpoints. It may be called before or while serving; a conflicting
// pattern panics, as with ServeMux.
func (s *Server) Handle(pattern string, h http.Handler) {
	s.mux.Handle(pattern, h)
}

// Serve listens on the unix socket path with mode 0600 and serves until
// Close, after which it returns nil. A socket file left by a dead gateway
// is removed first; if another process answers on it, Serve fails instead.
func (s *Server) Serve(path string) error {
	l, err := Listen(path)
	if err != nil {
		return err
	}
	return s.ServeListener(l)
}

// Listen opens the admin socket at path (mode 0600), first removing a stale
// socket file that nothing answers on. Callers that must know the socket is
// open before they go on call Listen, then ServeListener.
func Listen(path string) (net.Listener, error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: listen %s: %w", path, err)
	}
	// The state directory is 0700, so the brief window before chmod
	// exposes nothing.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("admin socket: chmod %s: %w", path, err)
	}
	return l, nil
}

// ServeListener serves admin requests on l, a listener from Listen, until
// Close. It returns nil after Close.
func (s *Server) ServeListener(l net.Listener) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		l.Close()
		return nil
	}
	s.log.Info("admin socket listening", "path", l.Addr().String())
	err := s.http.Serve(l) // removes the socket file when it closes l
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("admin socket: %w", err)
}

// Close stops serving, closes open connections and removes the socket
// file. Requests in progress are cut off.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if err := s.http.Close(); err != nil {
		return fmt.Errorf("close admin socket: %w", err)
	}
	return nil
}

// removeStaleSocket removes path if it is a socket nobody listens on.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("admin socket: %w", err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("admin socket: %s exists and is not a socket; move it away", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("admin socket %s is in use: is another gateway running with this --state?", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("admin socket: probe %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("admin socket: remove stale %s: %w", path, err)
	}
	return nil
}

func (s *Server) handleListTokens(w http.ResponseWriter, r *http.Request) {
	toks, err := s.store.Tokens()
	if err != nil {
		s.writeStoreError(w, err)
		return
	}
	if toks == nil {
		toks = []store.Token{}
	}
	for i := range toks {
		toks[i].Hash = nil // hashes stay in the state db
	}
	httpjson.Write(w, http.StatusOK, toks)
}

func (s *Server) handleCreateToken(w http.ResponseWriter, r *http.Request) {
	var req createTokenRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: "bad create token request: " + err.Error()})
		return
	}
	var ttl time.Duration
	if req.TTL != "" {
		var err error
		if ttl, err = time.ParseDuration(req.TTL); err != nil || ttl < 0 {
			httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: fmt.Sprintf("bad ttl %q: want a duration such as 24h, or 0 for never", req.TTL)})
			return
		}
	}
	var secret string
	var tok store.Token
	var err error
	if req.Secret != "" {
		secret = req.Secret
		tok, err = s.store.ImportToken(req.Name, req.Secret, ttl, time.Now())
	} else {
		secret, tok, err = s.store.CreateToken(req.Name, ttl, time.Now())
	}
	if err != nil {
		s.writeStoreError(w, err)
		return
	}
	s.log.Info("token created", "name", tok.Name, "expires", tok.Expires)
	tok.Hash = nil // hashes stay in the state db
	httpjson.Write(w, http.StatusOK, createTokenResponse{Secret: secret, Token: tok})
}

func (s *Server) handleRevokeToken(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.store.RevokeToken(name); err != nil {
		s.writeStoreError(w, err)
		return
	}
	res := RevokeResult{Ended: []KickedLease{}}
	if gw := s.gateway(); gw != nil {
		res.Ended = s.endTokenLeases(gw, name, "token "+name+" revoked")
	}
	s.log.Info("token revoked", "name", name, "leases_ended", len(res.Ended))
	httpjson.Write(w, http.StatusOK, res)
}

// writeStoreError maps store sentinels to codes that the client maps back.
func (s *Server) writeStoreError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		httpjson.Write(w, http.StatusNotFound, errorBody{Code: codeNotFound, Message: err.Error()})
	case errors.Is(err, store.ErrExists):
		httpjson.Write(w, http.StatusConflict, errorBody{Code: codeExists, Message: err.Error()})
	case errors.Is(err, store.ErrInvalidName):
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeInvalidName, Message: err.Error()})
	case errors.Is(err, store.ErrBadToken):
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: err.Error()})
	case errors.Is(err, store.ErrNotPermitted):
		httpjson.Write(w, http.StatusForbidden, errorBody{Code: codeNotPermitted, Message: err.Error()})
	default:
		s.log.Error("admin request failed", "err", err)
		httpjson.Write(w, http.StatusInternalServerError, errorBody{Code: codeInternal, Message: err.Error()})
	}
}
