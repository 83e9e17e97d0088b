// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"

	"github.com/airlock-vpn/airlock/internal/httpjson"
	"github.com/airlock-vpn/airlock/internal/statefile"
	"github.com/airlock-vpn/airlock/internal/store"
)

// Token restrictions through the admin socket:
//
//	PUT /v1/tokens/{name}/restrictions {"from":[PREFIX...],"attest":BOOL} → store.Token

// TokenRestrictions is the body of PUT /v1/tokens/{name}/restrictions.
type TokenRestrictions struct {
	// From are the networks the token's joins may come from; none means
	// anywhere.
	From []netip.Prefix `json:"from,omitempty"`
	// Attest requires a MUNGE credential with every join of the token.
	Attest bool `json:"attest,omitempty"`
}

func (s *Server) handleRestrictToken(w http.ResponseWriter, r *http.Request) {
	var req TokenRestrictions
	if err := decodeBody(w, r, &req); err != nil {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: "restrict token: want {\"from\": [networks], \"attest\": bool}: " + err.Error()})
		return
	}
	name := r.PathValue("name")
	rs := store.TokenRestrictions{From: req.From, Attest: req.Attest}
	if err := rs.Validate(); err != nil {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: "restrict token " + name + ": " + err.Error()})
		return
	}
	t, err := s.store.RestrictToken(name, rs)
	if err != nil {
		s.writeStoreError(w, err)
		return
	}
	s.log.Info("token restricted", "name", name, "from", t.From, "attest", t.Attest)
	t.Hash = nil
	httpjson.Write(w, http.StatusOK, t)
}

// RestrictToken sets the restrictions of the named token.
func (c *Client) RestrictToken(ctx context.Context, name string, r TokenRestrictions) (store.Token, error) {
	var t store.Token
	if err := c.do(ctx, http.MethodPut, "/v1/tokens/"+url.PathEscape(name)+"/restrictions", r, &t); err != nil {
		return store.Token{}, fmt.Errorf("restrict token: %w", err)
	}
	return t, nil
}

// RestrictToken sets the restrictions of the named token of stateDir
// through its gateway if it runs, else in its state database. Joins that
// come later are checked against them; running jobs keep their leases.
func RestrictToken(ctx context.Context, stateDir, name string, r TokenRestrictions) (store.Token, error) {
	c, err := Dial(stateDir)
	if err == nil {
		defer c.Close()
		return c.RestrictToken(ctx, name, r)
	}
	if !errors.Is(err, ErrNoGateway) {
		return store.Token{}, err
	}
	if ok, err := statefile.Exists(filepath.Join(stateDir, store.FileName)); err != nil {
		return store.Token{}, err
	} else if !ok {
		return store.Token{}, fmt.Errorf("restrict token %q: %w (no state db in %s)", name, store.ErrNotFound, stateDir)
	}
	var t store.Token
	err = withStore(stateDir, func(st *store.Store) error {
		var err error
		t, err = st.RestrictToken(name, store.TokenRestrictions{From: r.From, Attest: r.Attest})
		return err
	})
	return t, err
}
