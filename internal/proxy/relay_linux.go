// SPDX-License-Identifier: MIT

package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// sockaddr is ap as a socket address of lo's family (IPv4 addresses
// IPv4-mapped for Loopback4In6).
func sockaddr(lo Loopback, ap netip.AddrPort) unix.Sockaddr {
	if lo == Loopback4 {
		return &unix.SockaddrInet4{Addr: ap.Addr().Unmap().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

// loopbackSocket opens a socket of type typ (SOCK_STREAM or SOCK_DGRAM)
// of kind lo, connected to dst if it is valid, else bound to an
// ephemeral port of lo's loopback address, and returns it and its own
// address (IPv4-mapped addresses unmapped).
func loopbackSocket(typ int, lo Loopback, dst netip.AddrPort) (*os.File, netip.AddrPort, error) {
	fam := unix.AF_INET
	if lo != Loopback4 {
		fam = unix.AF_INET6
	}
	fd, err := unix.Socket(fam, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, netip.AddrPort{}, fmt.Errorf("socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), "loopback")
	fail := func(what string, err error) (*os.File, netip.AddrPort, error) {
		f.Close()
		return nil, netip.AddrPort{}, fmt.Errorf("%s: %w", what, err)
	}
	if lo == Loopback4In6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return fail("clear IPV6_V6ONLY", err)
		}
	}
	if dst.IsValid() {
		for {
			err = unix.Connect(fd, sockaddr(lo, dst))
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		if err != nil {
			return fail(fmt.Sprintf("connect %v", dst), err)
		}
	} else if err := unix.Bind(fd, sockaddr(lo, netip.AddrPortFrom(lo.addr(), 0))); err != nil {
		return fail("bind", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	var local netip.AddrPort
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		local = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		local = netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	default:
		return fail("getsockname", fmt.Errorf("address %T", sa))
	}
	return f, local, nil
}

// connectFile connects the socket f, of kind lo, to ap.
func connectFile(f *os.File, lo Loopback, ap netip.AddrPort) error {
	if err := unix.Connect(int(f.Fd()), sockaddr(lo, ap)); err != nil {
		return fmt.Errorf("connect loopback udp socket to relay %v: %w", ap, err)
	}
	return nil
}
