// SPDX-License-Identifier: MIT

package admin

import "errors"

// ErrNoGateway means no gateway serves the admin socket of the state
// directory: the socket file is missing or nobody listens on it.
var ErrNoGateway = errors.New("no gateway running")
