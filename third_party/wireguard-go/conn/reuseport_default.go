//go:build !linux

/* SPDX-License-Identifier: MIT
 *
 * Airlock: several StdNetBinds on one port.
 */

package conn

import (
	"errors"
	"syscall"
)

func setReusePort(syscall.RawConn) error {
	return errors.New("SO_REUSEPORT: not supported on this platform")
}
