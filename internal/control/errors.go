// SPDX-License-Identifier: MIT

package control

import (
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Sentinel errors. Client methods return errors that match them with
// errors.Is; a [Backend] returns ErrNoAddress and ErrUnknownLease (possibly
// wrapped) so that the server answers with the right code.
var (
	// ErrPinMismatch means the gateway's certificate fingerprint is not
	// the pinned one.
	ErrPinMismatch = errors.New("gateway fingerprint does not match pin")
	// ErrUnreachable means no TCP connection to the gateway could be made.
	ErrUnreachable = errors.New("gateway unreachable")
	// ErrBadRequest means the gateway rejected a malformed request.
	ErrBadRequest = errors.New("bad request")
	// ErrBadToken means the gateway rejected the join token.
	ErrBadToken = errors.New("bad token")
	// ErrRateLimited means the gateway refuses requests from this address
	// for a while after too many failures.
	ErrRateLimited = errors.New("rate limited")
	// ErrNoAddress means the gateway has no free tunnel address or port
	// block.
	ErrNoAddress = errors.New("no free address")
	// ErrUnknownLease means the lease does not exist (expired or
	// released) or its secret is wrong.
	ErrUnknownLease = errors.New("unknown lease")
	// ErrDraining means the gateway is draining: it takes no new jobs.
	ErrDraining = errors.New("gateway draining")
	// ErrWatchSilent means a lease watch heard nothing for
	// WatchMissedHeartbeats heartbeat intervals.
	ErrWatchSilent = errors.New("gateway silent")
	// ErrLeaseEnded means the gateway ended the lease on purpose (an admin
	// kicked the job); the error's message says who and why.
	ErrLeaseEnded = errors.New("lease ended by the gateway")
	// ErrQuota means a join went over a quota of its token.
	ErrQuota = errors.New("token quota exceeded")
	// ErrBanned means an admin banned the token and host of a join for a
	// while (airlock kick --ban).
	ErrBanned = errors.New("banned")
	// ErrKeyInUse means a join's public key holds another live lease.
	ErrKeyInUse = errors.New("public key holds a live lease")
	// ErrVersionUnsupported means the gateway does not serve this
	// client's version; the error's message names both and the fix.
	ErrVersionUnsupported = errors.New("client version not supported by the gateway")
	// ErrNotSupported is a Backend's answer to an optional service it
	// does not offer (the TCP transport, site-local bypass).
	ErrNotSupported = errors.New("not supported by this gateway")
)

// APIError is an error response from the gateway.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the [ErrorResponse] code, e.g. [CodeBadToken]; empty if the
	// body was not an ErrorResponse.
	Code string
	// Message is the gateway's explanation for humans.
	Message string
	// RetryAfter is the wait the gateway asked for (Retry-After), or 0.
	RetryAfter time.Duration
}

// Error implements error.
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	code := e.Code
	if code == "" {
		code = "no code"
	}
	return fmt.Sprintf("gateway answered %d (%s): %s", e.Status, code, msg)
}

// Is reports whether e's code corresponds to target, one of ErrBadRequest,
// ErrBadToken, ErrRateLimited, ErrNoAddress, ErrUnknownLease.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.Code == CodeBadRequest
	case ErrBadToken:
		return e.Code == CodeBadToken
	case ErrRateLimited:
		return e.Code == CodeRateLimited
	case ErrNoAddress:
		return e.Code == CodeNoAddress
	case ErrUnknownLease:
		return e.Code == CodeUnknownLease
	case ErrDraining:
		return e.Code == CodeDraining
	case ErrLeaseEnded:
		return e.Code == CodeLeaseEnded
	case ErrQuota:
		return e.Code == CodeQuota
	case ErrBanned:
		return e.Code == CodeBanned
	case ErrKeyInUse:
		return e.Code == CodeKeyInUse
	case ErrVersionUnsupported:
		return e.Code == CodeVersionUnsupported
	case ErrAttestation:
		return e.Code == CodeAttestation
	case ErrAttestationRequired:
		return e.Code == CodeAttestationRequired
	}
	return false
}

// PinMismatchError reports a gateway certificate whose fingerprint is not
// the pinned one. It matches [ErrPinMismatch] with errors.Is.
type PinMismatchError struct {
	// Gateway is the gateway's HOST:PORT, empty if unknown.
	Gateway string
	// Expected is the pinned fingerprint, Presented the gateway's, both
	// in the form "sha256:<hex>".
	Expected, Presented string
}

// Error implements error.
func (e *PinMismatchError) Error() string {
	gw := "gateway"
	if e.Gateway != "" {
		gw = "gateway " + e.Gateway
	}
	return fmt.Sprintf("%s presented fingerprint %s, expected %s: check AIRLOCK_PIN (the admin's join.env) or whether you reach the right gateway",
		gw, e.Presented, e.Expected)
}

// Is reports whether target is ErrPinMismatch.
func (e *PinMismatchError) Is(target error) bool { return target == ErrPinMismatch }
