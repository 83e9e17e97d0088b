// SPDX-License-Identifier: MIT

package netstack

import (
	"errors"
	"fmt"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// ErrDestinationDenied reports a destination no job may reach through the
// gateway: the built-in floor or the policy denied it (loopback, the tunnel
// subnet, multicast, protected ranges, policy rules). After Close, Read
// and Write return os.ErrClosed, as wireguard-go expects of a tun.Device.
var ErrDestinationDenied = errors.New("destination denied")

// tcpipError converts a gVisor error to a Go error. It is the only place
// where tcpip.Error crosses into the rest of the package.
func tcpipError(op string, err tcpip.Error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %s", op, err)
}
