/* SPDX-License-Identifier: MIT
 *
 * Airlock: several StdNetBinds on one port.
 */

package conn

import (
	"net"
	"syscall"
)

// NewStdNetBindReusePort returns a StdNetBind whose sockets set
// SO_REUSEPORT before they bind. Several such binds, opened on the same
// port by the same user, share it: the kernel spreads the datagrams that
// arrive among their sockets by a hash of the source and destination
// addresses and ports, so each remote endpoint's datagrams always reach the
// same socket, and each socket has a receive queue and a reader of its own.
// The first bind may be opened on port 0; the others on the port it got.
// Where SO_REUSEPORT is missing, Open fails.
func NewStdNetBindReusePort() Bind {
	b := NewStdNetBind().(*StdNetBind)
	b.reusePort = true
	return b
}

// reusePortConfig returns lc with SO_REUSEPORT set before the bind, after
// lc's own options.
func reusePortConfig(lc *net.ListenConfig) *net.ListenConfig {
	ctl := lc.Control
	return &net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		if ctl != nil {
			if err := ctl(network, address, c); err != nil {
				return err
			}
		}
		return setReusePort(c)
	}}
}
