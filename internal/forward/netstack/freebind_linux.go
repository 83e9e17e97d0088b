// SPDX-License-Identifier: MIT

package netstack

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// freebind is a net.Dialer and net.ListenConfig Control that lets a socket
// bind to an address no interface has (IP_FREEBIND, IPV6_FREEBIND: no
// privilege needed): a job's own public IPv6 address (the gateway's
// --egress-prefix), which the host receives through a local route for
// the prefix.
func freebind(network, _ string, c syscall.RawConn) error {
	level, opt := unix.IPPROTO_IP, unix.IP_FREEBIND
	switch network {
	case "tcp6", "udp6":
		level, opt = unix.IPPROTO_IPV6, unix.IPV6_FREEBIND
	case "tcp4", "udp4":
	default:
		return nil
	}
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), level, opt, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
