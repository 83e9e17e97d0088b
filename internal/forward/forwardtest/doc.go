// SPDX-License-Identifier: MIT

// Package forwardtest is the conformance suite of the gateway's egress
// backends: one set of tests that every backend (user mode with kernel
// TCP, user mode all in gVisor, kernel mode) runs from its own package's
// tests, so that "both backends enforce it identically" is checked, not
// claimed. It plays the part of rootlesskit's pkg/port/testsuite for port
// drivers.
//
// # Theory of operation
//
// A backend's test calls [Isolate], which re-executes the test binary into
// a fresh user and network namespace where the test is root of its own
// user namespace: no privilege on the host is needed (nor used when the
// tests run as root). Inside, [Run] builds the topology:
//
//	job stacks (gVisor, one per job) ── packet device ── backend ── egress0 203.0.113.1/24, 2001:db8:e::1/64
//	                                                                   │ veth
//	                      outside namespace:  peer0 203.0.113.2/24, 10.99.0.2/24, 2001:db8:e::2/64, fd99::2/64
//
// Every job has an address of each family (100.64.1.x, fd00:a10c::1:x)
// and every data-plane test runs once per family (subtests IPv4 and
// IPv6), so that a backend that breaks one family fails by name.
//
// The job side is real TCP/IP: one gVisor stack per job, attached
// to the backend's packet device (its tun.Device Read and Write, as the
// WireGuard device would be) by two pumps that carry whole IP packets. The
// outside is real sockets in a network namespace of its own ([Outside]):
// TCP, UDP and DNS servers the tests open there, reachable only through
// the backend's egress. So what the suite observes (source ports, resets,
// replies, exposures) is what a real outside host would see.
//
// The suite drives the backend only through [Backend] and observes flows
// through the flows.Table it hands to the backend's constructor ([Env]).
package forwardtest
