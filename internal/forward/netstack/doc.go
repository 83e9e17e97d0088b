// SPDX-License-Identifier: MIT

// Package netstack is the gateway's user-mode egress: a gVisor TCP/IP stack
// in user space that terminates job flows and re-originates them as ordinary
// host sockets, so the gateway needs no privileges.
//
// # Theory of operation
//
// A [Stack] is a [forward.Backend] (a wireguard-go tun.Device). The
// WireGuard device writes decrypted job packets with Write; they are injected
// into one gVisor NIC backed by a packet-queue link endpoint. The NIC is
// promiscuous (it accepts packets for any destination, i.e. the job's real
// destination) and spoofing (it may send from any source, i.e. answer as that
// destination). Default IPv4 and IPv6 routes point at the NIC. Packets the
// stack emits are queued on the link endpoint and handed to the WireGuard
// device by Read. The link endpoint (internal/stacklink) coalesces each
// Write batch with GRO and lets the stack's TCP emit large segments that
// Read splits into MTU-sized packets (GSO); neither allocates per packet.
//
// TCP: the stack's TCP forwarder hands each new SYN to handleTCP in its own
// goroutine. The flow is checked by checkFlow (floor and policy); then the real
// destination is dialled from the host first. Only if that succeeds is the
// job's handshake completed; otherwise the job gets a RST, so it sees
// "connection refused" at once rather than a hang. The two connections are then
// spliced with pooled buffers, propagating half-close (EOF on one side becomes
// CloseWrite on the other). At most Config.MaxInFlightSYN handshakes are
// pending at once; further SYNs are dropped (the job retransmits).
//
// UDP: the first datagram of each 4-tuple reaches handleUDP, which creates a
// connected netstack endpoint for the flow and a connected host UDP socket to
// the destination, and relays datagrams both ways until the flow has been idle
// in both directions for Config.UDPIdleTimeout.
//
// DNS: each gateway tunnel address (Config.Addrs) has a DNS server on port 53
// (UDP and TCP) inside the netstack; endpoints bound there take precedence
// over the forwarders. Queries are relayed with github.com/miekg/dns to the
// upstream resolvers, tried in order; when all fail the job gets SERVFAIL.
//
// Safety: nothing a job sends may reach the gateway host's loopback, the
// tunnel subnet (other jobs; the tunnel address itself only for DNS and
// echo, which the netstack answers), or multicast/broadcast addresses: the
// floor of package policy (policy.Builtin), applied in checkFlow. gVisor
// additionally drops packets with loopback source or destination addresses
// on the NIC.
//
// Policy (policy.go): on top of that floor, every new TCP connection, UDP
// flow and ICMP echo flow is decided by the site's policy (SetPolicy, rules
// of package policy, with the job's token from AddJob and whether the
// destination is one of the host's own addresses) before anything is
// dialled: a denied SYN gets a RST, denied datagrams and echo requests are
// dropped, and each denial is counted under its rule (Stats.PolicyDrops).
//
// ICMP echo: the netstack answers echo requests to the tunnel address.
// IPv4 and IPv6 echo requests to other destinations never enter the
// netstack (it would answer them on the destination's behalf): Write
// hands them to the ping relay (ping.go), which checks the destination
// like a flow and sends them from host ICMP or ICMPv6 "ping" sockets, one
// per job echo flow, and returns the replies to the job with its own echo
// id.
//
// All exported methods of Stack are safe for concurrent use.
package netstack
