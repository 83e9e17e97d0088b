// SPDX-License-Identifier: MIT

package netstack

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// freebind6 is a net.Dialer and net.ListenConfig Control that lets an
// IPv6 socket bind to an address no interface has (IPV6_FREEBIND, no
// privilege needed): a job's own public IPv6 address (the gateway's
// --egress-prefix6), which the host receives through a local route for
// the prefix. It does nothing to IPv4 sockets.
func freebind6(network, _ string, c syscall.RawConn) error {
	if network != "tcp6" && network != "udp6" {
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
