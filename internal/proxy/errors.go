// SPDX-License-Identifier: MIT

package proxy

import "errors"

var (
	// ErrAuth means a client did not present the job's secret.
	ErrAuth = errors.New("proxy authentication failed")
	// ErrProtocol means a client spoke the protocol wrongly.
	ErrProtocol = errors.New("proxy protocol error")
)
