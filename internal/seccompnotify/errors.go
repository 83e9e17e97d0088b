// SPDX-License-Identifier: MIT

package seccompnotify

import "errors"

// ErrUnavailable means this kernel or architecture cannot run a job under
// a seccomp user-notification filter with fd injection.
var ErrUnavailable = errors.New("seccomp user notification unavailable")
