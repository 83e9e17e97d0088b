// SPDX-License-Identifier: MIT

package nsexec

import "errors"

// Sentinel errors, checked with errors.Is. The errors returned by [Start] and
// [Preflight] wrap them with a message that says what to do.
var (
	// ErrUserNamespace means an unprivileged user namespace (or the
	// capabilities in it) cannot be had on this host.
	ErrUserNamespace = errors.New("cannot create user namespace")
	// ErrNoTUN means /dev/net/tun does not exist.
	ErrNoTUN = errors.New("no /dev/net/tun")
	// ErrTUNPermission means /dev/net/tun exists but the user may not open it.
	ErrTUNPermission = errors.New("cannot open /dev/net/tun")
	// ErrSetup means the namespace child failed to set up the job's
	// namespace for another reason.
	ErrSetup = errors.New("cannot set up job namespace")
)

// hintError is a user-facing error: msg says what happened and what to do,
// kind is the sentinel it matches and cause the underlying error.
type hintError struct {
	kind  error
	msg   string
	cause error
}

func (e *hintError) Error() string { return e.msg }

// Unwrap returns the sentinel and the cause, so errors.Is matches both.
func (e *hintError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}
