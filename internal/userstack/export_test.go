// SPDX-License-Identifier: MIT

package userstack

import (
	"errors"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
)

// dnsListener opens UDP port 53 on the stack's address (for tests that
// serve DNS from a stack).
func (s *Stack) dnsListener() (*gonet.UDPConn, error) {
	la := full(netip.AddrPortFrom(s.cfg.Addrs[0], 53))
	return gonet.DialUDP(s.ns, &la, nil, proto(s.cfg.Addrs[0]))
}

func asDNSError(err error, de **net.DNSError) bool { return errors.As(err, de) }
