package proxy

import (
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// connectFile connects the socket f to ap.
func connectFile(f *os.File, ap netip.AddrPort) error {
	var sa unix.Sockaddr
	if ap.Addr().Is4() {
		sa = &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	} else {
		sa = &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
	}
	if err := unix.Connect(int(f.Fd()), sa); err != nil {
		return fmt.Errorf("connect loopback udp socket to relay %v: %w", ap, err)
	}
	return nil
}
