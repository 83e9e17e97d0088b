// SPDX-License-Identifier: MIT

package control

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/airlock-vpn/airlock/internal/identity"
)

// Identity from bearer tokens on the wire. A join may carry the job's
// bearer token (a WLCG/SciTokens JWT its pilot got from the experiment's
// issuer, JoinRequest.Bearer); the control server has a [BearerVerifier]
// verify it before the join reaches the Backend, which then finds the
// issuer-verified identity in JoinRequest.Issued. A renewal carries the
// current token again (RenewRequest.Bearer, SessionRequest.Bearer): the
// pilot refreshes its token file and the job's lease follows; the server
// verifies it and hands it to the Backend's Reidentify before Renew.

// BearerVerifier verifies the bearer tokens of joins and renewals
// (internal/bearer is the gateway's). Safe for concurrent use.
type BearerVerifier interface {
	// Verify checks token and returns the identity it proves. Errors
	// wrap ErrBearer with a sentence for the user (expired, wrong
	// audience or issuer, forged, missing scope), or ErrBearerUnavailable
	// when the gateway cannot tell now (the issuer's keys are unknown).
	// (nil, nil) means the gateway takes no bearer tokens now (a reload
	// removed its issuers).
	Verify(ctx context.Context, token string) (*identity.Issued, error)
	// Required reports whether every join must carry a valid token.
	Required() bool
}

// Errors of bearer tokens.
var (
	// ErrBearer means a join's or renewal's bearer token was refused;
	// the message says why and what to do.
	ErrBearer = errors.New("bearer token refused")
	// ErrBearerRequired means the gateway requires a bearer token and
	// the join had none.
	ErrBearerRequired = errors.New("bearer token required")
	// ErrBearerUnavailable means the gateway cannot check bearer tokens
	// now: it does not know the issuer's keys (never fetched, issuer
	// unreachable). It clears with time.
	ErrBearerUnavailable = errors.New("bearer token cannot be checked now")
)

// Codes of those errors in [ErrorResponse.Code].
const (
	CodeBearer            = "bearer_refused"
	CodeBearerRequired    = "bearer_required"
	CodeBearerUnavailable = "bearer_unavailable"
)

// MsgBearerRequired is the message of a CodeBearerRequired response.
const MsgBearerRequired = "this gateway requires the job's bearer token (WLCG token discovery: BEARER_TOKEN, BEARER_TOKEN_FILE, $XDG_RUNTIME_DIR/bt_u$UID or /tmp/bt_u$UID) with every join; the pilot must provide one"

// MaxBearer bounds a bearer token's text on the wire.
const MaxBearer = 16 << 10

// checkBearer checks a token's shape: bounded printable ASCII without
// spaces (the verifier checks the rest).
func checkBearer(field, tok string) error {
	switch {
	case tok == "":
		return nil
	case len(tok) > MaxBearer:
		return fmt.Errorf("%s: %d bytes, longer than the limit of %d", field, len(tok), MaxBearer)
	case !printableASCII(tok) || strings.Count(tok, ".") != 2:
		return fmt.Errorf("%s: not a JWT (want header.payload.signature)", field)
	}
	return nil
}

// verifyBearer verifies tok with s's verifier: the identity, or an error
// for the refusal table.
func (s *Server) verifyBearer(ctx context.Context, tok string) (*identity.Issued, error) {
	if s.bearer == nil {
		return nil, fmt.Errorf("%w: this gateway takes no bearer tokens (it trusts no issuer): join with a token (AIRLOCK_TOKEN), or run airlock run with --bearer off", ErrBearer)
	}
	id, err := s.bearer.Verify(ctx, tok)
	if err != nil {
		return nil, err
	}
	if id == nil {
		return nil, fmt.Errorf("%w: this gateway takes no bearer tokens now (it trusts no issuer)", ErrBearer)
	}
	return id, nil
}

// reidentify verifies a renewal's bearer token ("" for none) and hands
// the identity to the Backend. A token that is refused, or cannot be
// checked now, leaves the lease's identity as it was and the renewal
// goes on: the lease lives until the last good token expires, and the
// Backend's Renew then ends it saying so.
func (s *Server) reidentify(ctx context.Context, ref LeaseRef, tok string) error {
	if tok == "" {
		return s.backend.Reidentify(ref, nil)
	}
	if err := s.backend.CheckLease(ref); err != nil {
		return err // not spending a verification on a request without a lease
	}
	id, err := s.verifyBearer(ctx, tok)
	if errors.Is(err, ErrBearer) || errors.Is(err, ErrBearerUnavailable) {
		s.log.Info("renewal's bearer token not taken; the lease keeps its identity until the last good token expires", "lease", ref.ID, "err", err)
		return s.backend.Reidentify(ref, nil)
	}
	if err != nil {
		return err
	}
	return s.backend.Reidentify(ref, id)
}
