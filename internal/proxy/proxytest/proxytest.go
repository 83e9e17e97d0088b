// SPDX-License-Identifier: MIT

// Package proxytest provides the loopback peers that the tests of the
// proxies, the preload library and the seccomp supervisor relay to: a TCP
// server that runs a handler per connection and a UDP server that echoes
// every datagram with a prefix. Both stop when the test ends.
package proxytest

import (
	"io"
	"net"
	"net/netip"
	"testing"
)

// loopback4 is where TCPServer and UDPEcho listen.
var loopback4 = netip.MustParseAddr("127.0.0.1")

// TCPServer listens on 127.0.0.1 and runs handle for every connection
// (closing it after), until the test ends; it returns its address.
func TCPServer(t testing.TB, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	return TCPServerAt(t, loopback4, handle)
}

// TCPServerAt is TCPServer listening on the loopback address lo (127.0.0.1
// or ::1); a host without IPv6 loopback skips the test.
func TCPServerAt(t testing.TB, lo netip.Addr, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(lo, 0).String())
	if err != nil {
		skipWithoutIPv6(t, lo, err)
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); handle(c) }()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String())
}

// Echo is a TCPServer handler that echoes everything back.
func Echo(c net.Conn) { _, _ = io.Copy(c, c) }

// Greet returns a TCPServer handler that writes msg and closes.
func Greet(msg string) func(net.Conn) {
	return func(c net.Conn) { _, _ = c.Write([]byte(msg)) }
}

// UDPEcho listens on 127.0.0.1 and answers every datagram (up to 2048
// bytes) with prefix followed by it, until the test ends; it returns its
// address.
func UDPEcho(t testing.TB, prefix string) netip.AddrPort {
	t.Helper()
	return UDPEchoAt(t, loopback4, prefix)
}

// UDPEchoAt is UDPEcho listening on the loopback address lo (127.0.0.1 or
// ::1); a host without IPv6 loopback skips the test.
func UDPEchoAt(t testing.TB, lo netip.Addr, prefix string) netip.AddrPort {
	t.Helper()
	u, err := net.ListenPacket("udp", netip.AddrPortFrom(lo, 0).String())
	if err != nil {
		skipWithoutIPv6(t, lo, err)
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	go func() {
		b := make([]byte, 2048)
		for {
			n, a, err := u.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = u.WriteTo(append([]byte(prefix), b[:n]...), a)
		}
	}()
	return netip.MustParseAddrPort(u.LocalAddr().String())
}

// skipWithoutIPv6 skips the test if listening on the IPv6 address lo
// failed (a host or container without IPv6 loopback).
func skipWithoutIPv6(t testing.TB, lo netip.Addr, err error) {
	t.Helper()
	if lo.Is6() && !lo.Is4In6() {
		t.Skipf("no IPv6 loopback: %v", err)
	}
}
