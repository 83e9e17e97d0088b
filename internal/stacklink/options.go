// SPDX-License-Identifier: MIT

package stacklink

import (
	"fmt"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// TCP buffer sizes of both stacks: auto-tuned between the minimum and the
// maximum, starting at the default.
const (
	tcpBufMin     = 4 << 10
	tcpBufDefault = 1 << 20
	tcpBufMax     = 8 << 20
)

// StackOptions are the protocols of both stacks: IPv4 and IPv6 with TCP,
// UDP and ICMP (echo). Callers add their own options (e.g. HandleLocal).
func StackOptions() stack.Options {
	return stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	}
}

// TuneTCP sets the TCP options of both stacks on ns: SACK, send and
// receive buffers of 1 MiB auto-tuned up to 8 MiB, and cubic congestion
// control.
func TuneTCP(ns *stack.Stack) error {
	sack := tcpip.TCPSACKEnabled(true)
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	cc := tcpip.CongestionControlOption("cubic")
	for _, o := range []struct {
		what string
		opt  tcpip.SettableTransportProtocolOption
	}{
		{"enable tcp sack", &sack},
		{"set tcp receive buffer range", &tcpip.TCPReceiveBufferSizeRangeOption{Min: tcpBufMin, Default: tcpBufDefault, Max: tcpBufMax}},
		{"set tcp send buffer range", &tcpip.TCPSendBufferSizeRangeOption{Min: tcpBufMin, Default: tcpBufDefault, Max: tcpBufMax}},
		{"enable tcp receive buffer auto-tuning", &moderate},
		{"set tcp congestion control", &cc},
	} {
		if err := ns.SetTransportProtocolOption(tcp.ProtocolNumber, o.opt); err != nil {
			return fmt.Errorf("%s: %s", o.what, err)
		}
	}
	return nil
}
