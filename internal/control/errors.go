// SPDX-License-Identifier: MIT

package control

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"
)

// Sentinel errors. Client methods return errors that match them with
// errors.Is; a [Backend] returns them (possibly wrapped) so that the server
// answers with the code, status and Retry-After of their row in the
// refusals table below.
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
	// ErrStoreUnavailable means the gateway cannot check joins now: it is
	// a fail-closed member of a fleet whose database it cannot reach. A
	// later join, or another gateway, may succeed.
	ErrStoreUnavailable = errors.New("gateway cannot check joins now")
	// ErrNotSupported is a Backend's answer to an optional service it
	// does not offer (the TCP transport, site-local bypass).
	ErrNotSupported = errors.New("not supported by this gateway")
	// ErrBusy means the gateway has more requests than it can answer in
	// time; it names how long to wait before asking again.
	ErrBusy = errors.New("gateway busy")
	// ErrInternal is the gateway's failure, not the request's; any error
	// a Backend returns that wraps no other sentinel is answered as it.
	ErrInternal = errors.New("internal gateway error")
)

// A refusal is one row of the protocol's table of refusals (refusals): the
// sentinel error a Backend returns or the server finds, the code and HTTP
// status it is answered with, whether it counts as a failure of the source
// address (failures.go), and the wait a client is told to wait out
// (Retry-After) before it asks again. A refusal with a wait clears with
// time (a busy or draining gateway, a rate or quota), and airlock run waits
// it out within its --join-timeout; one without is definite (a bad token, a
// ban, a full gateway) and ends the job's start.
type refusal struct {
	err     error
	code    string
	status  int
	failure bool
	wait    time.Duration
	// message, if set, is the sentence answered for err; nil: err's own.
	message func(err error) string
}

// refusals is the one table of sentinel error → code → HTTP status →
// Retry-After; the server answers (writeRefusal) and the client matches
// (APIError.Is) from it. Checked in order: the first sentinel err wraps
// decides.
var refusals = []refusal{
	{err: ErrBadRequest, code: CodeBadRequest, status: http.StatusBadRequest, failure: true},
	{err: ErrBadToken, code: CodeBadToken, status: http.StatusForbidden, failure: true,
		message: func(err error) string {
			if fe := (*tokenFromError)(nil); errors.As(err, &fe) {
				return fe.msg
			}
			return MsgBadToken
		}},
	{err: ErrAttestation, code: CodeAttestation, status: http.StatusForbidden, failure: true},
	{err: ErrAttestationRequired, code: CodeAttestationRequired, status: http.StatusForbidden, failure: true,
		message: func(err error) string {
			return strings.TrimPrefix(err.Error(), ErrAttestationRequired.Error()+": ")
		}},
	{err: ErrBearer, code: CodeBearer, status: http.StatusForbidden, failure: true},
	{err: ErrBearerRequired, code: CodeBearerRequired, status: http.StatusForbidden, failure: true,
		message: func(err error) string {
			return strings.TrimPrefix(err.Error(), ErrBearerRequired.Error()+": ")
		}},
	{err: ErrBearerUnavailable, code: CodeBearerUnavailable, status: http.StatusServiceUnavailable, wait: 10 * time.Second},
	{err: ErrUnknownLease, code: CodeUnknownLease, status: http.StatusNotFound, failure: true,
		message: func(error) string {
			return "unknown lease: it expired, was released or its secret is wrong; join again"
		}},
	{err: ErrKeyInUse, code: CodeKeyInUse, status: http.StatusConflict, failure: true},
	{err: ErrLeaseEnded, code: CodeLeaseEnded, status: http.StatusGone},
	{err: ErrBanned, code: CodeBanned, status: http.StatusForbidden},
	{err: ErrVersionUnsupported, code: CodeVersionUnsupported, status: http.StatusUpgradeRequired,
		message: func(err error) string {
			return strings.TrimPrefix(err.Error(), ErrVersionUnsupported.Error()+": ")
		}},
	{err: ErrNoAddress, code: CodeNoAddress, status: http.StatusServiceUnavailable, message: noAddressMessage},
	{err: ErrRateLimited, code: CodeRateLimited, status: http.StatusTooManyRequests, wait: time.Second},
	{err: ErrQuota, code: CodeQuota, status: http.StatusTooManyRequests, wait: 10 * time.Second},
	{err: ErrDraining, code: CodeDraining, status: http.StatusServiceUnavailable, wait: 10 * time.Second,
		message: func(error) string {
			return "gateway is draining: it takes no new jobs for now; use another gateway or wait"
		}},
	{err: ErrBusy, code: CodeBusy, status: http.StatusServiceUnavailable, wait: time.Second},
	{err: ErrAttestationUnavailable, code: CodeAttestationUnavailable, status: http.StatusServiceUnavailable, failure: true, wait: 5 * time.Second,
		message: func(error) string {
			return "the gateway cannot check MUNGE credentials now (its munged fails or is slow); retry, or use another gateway"
		}},
	{err: ErrBadTicket, code: CodeBadTicket, status: http.StatusForbidden, failure: true,
		message: func(error) string { return ErrBadTicket.Error() }},
	{err: ErrNoSuchCapture, code: CodeNoSuchCapture, status: http.StatusNotFound},
	{err: ErrStoreUnavailable, code: CodeStoreUnavailable, status: http.StatusServiceUnavailable, wait: 10 * time.Second,
		message: func(err error) string {
			return strings.TrimPrefix(err.Error(), ErrStoreUnavailable.Error()+": ")
		}},
	{err: ErrInternal, code: CodeInternal, status: http.StatusInternalServerError, wait: 5 * time.Second,
		message: func(error) string { return "internal gateway error; the gateway's log has details" }},
}

// noAddressMessage is the answer to a join the gateway has no room for.
func noAddressMessage(err error) string {
	if _, detail, ok := strings.Cut(err.Error(), ErrNoAddress.Error()+": "); ok && detail != "" {
		return "gateway has no room for another job (" + detail + "); use another gateway or ask its admin"
	}
	return "gateway has no free tunnel address or port block; use another gateway or ask its admin"
}

// refusalOf returns the row of err's first sentinel, or the internal
// error's row for an error that wraps none.
func refusalOf(err error) refusal {
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			return r
		}
	}
	return refusals[len(refusals)-1]
}

// Clears reports whether err is a refusal that clears with time (its row
// has a wait: a busy or draining gateway, a rate or quota), which airlock
// run waits out, rather than a definite one.
func Clears(err error) bool { return refusalOf(err).wait > 0 }

// RetryAfterError is a refusal that names its own wait, e.g. the time until
// a token's join rate admits the next join. Make it with [WithRetryAfter].
type RetryAfterError struct {
	Err  error
	Wait time.Duration
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// WithRetryAfter returns err with wait as its Retry-After, in place of its
// row's default. A wait below one second is answered as one second.
func WithRetryAfter(err error, wait time.Duration) error {
	return &RetryAfterError{Err: err, Wait: wait}
}

// retryAfterSeconds is the Retry-After of err's refusal r: err's own wait
// (WithRetryAfter), else r's, in whole seconds rounded up; 0 for a definite
// refusal.
func retryAfterSeconds(err error, r refusal) int64 {
	if r.wait <= 0 {
		return 0
	}
	wait := r.wait
	if re := (*RetryAfterError)(nil); errors.As(err, &re) && re.Wait > 0 {
		wait = re.Wait
	}
	return max(1, int64(math.Ceil(wait.Seconds())))
}

// APIError is an error response from the gateway.
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Code is the [ErrorResponse] code, e.g. [CodeBadToken]; empty if the
	// body was not an ErrorResponse.
	Code string
	// Message is the gateway's explanation for humans.
	Message string
	// RetryAfter is the wait the gateway asked for (Retry-After), or 0: a
	// refusal with a wait clears with time, one without is definite.
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

// Is reports whether e's code is the code of target, one of the sentinel
// errors of the refusals table.
func (e *APIError) Is(target error) bool {
	for _, r := range refusals {
		if r.err == target {
			return e.Code == r.code
		}
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
