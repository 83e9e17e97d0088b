/* SPDX-License-Identifier: MIT
 *
 * Airlock: several StdNetBinds on one port.
 */

package conn

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

func setReusePort(c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set SO_REUSEPORT: %w", serr)
	}
	return nil
}
