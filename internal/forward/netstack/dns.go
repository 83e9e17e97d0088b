// SPDX-License-Identifier: MIT

package netstack

import (
	"fmt"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
)

// startDNS binds the tunnel address self port 53 inside the netstack, UDP
// and TCP, and serves it with a dnsfwd relay to the upstreams. Endpoints
// bound there take precedence over the forwarders.
func startDNS(s *Stack, self netip.Addr) (*dnsfwd.Server, error) {
	fa := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(self.AsSlice()), Port: dnsPort}
	proto := protoOf(self)
	pc, err := gonet.DialUDP(s.ns, &fa, nil, proto)
	if err != nil {
		return nil, fmt.Errorf("dns: listen udp %s: %w", net.JoinHostPort(self.String(), "53"), err)
	}
	ln, err := gonet.ListenTCP(s.ns, fa, proto)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("dns: listen tcp %s: %w", net.JoinHostPort(self.String(), "53"), err)
	}
	return dnsfwd.Start(dnsfwd.Config{
		Logger:    s.log,
		Upstreams: s.cfg.DNSUpstreams,
		Route:     s.cfg.DNSRoute,
		Observe: func(failed bool) {
			s.stats.dnsQueries.Add(1)
			if failed {
				s.stats.dnsFailures.Add(1)
			}
		},
		Debug:   s.flowDebugOn,
		Flows:   s.cfg.Flows,
		Limiter: &s.dnsLimits,
	}, pc, ln)
}
