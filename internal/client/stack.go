package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"golang.zx2c4.com/wireguard/tun/netstack"
)

// stackDialer is the client-side user-space TCP/IP stack (gVisor, through
// wireguard-go's tun/netstack) attached to the job's WireGuard device: the
// fallback modes' only way out. It implements proxy.Dialer.
type stackDialer struct {
	net  *netstack.Net
	addr netip.Addr // the job's tunnel address
}

// errnoFor maps the stack's errors (gVisor tcpip errors turned into text by
// gonet) to the errno a kernel socket would give, so that intercepted
// programs and proxy clients see ordinary failures.
func errnoFor(err error) error {
	if err == nil {
		return nil
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return err
	}
	s := err.Error()
	for _, m := range []struct {
		text  string
		errno syscall.Errno
	}{
		{"connection was refused", syscall.ECONNREFUSED},
		{"connection refused", syscall.ECONNREFUSED},
		{"connection reset", syscall.ECONNRESET},
		{"no route to host", syscall.EHOSTUNREACH},
		{"host is unreachable", syscall.EHOSTUNREACH},
		{"network is unreachable", syscall.ENETUNREACH},
		{"timed out", syscall.ETIMEDOUT},
		{"deadline exceeded", syscall.ETIMEDOUT},
	} {
		if strings.Contains(s, m.text) {
			return fmt.Errorf("%w (%v)", m.errno, err)
		}
	}
	return err
}

func (d *stackDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	if !dst.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("dial %v: %w (the tunnel carries IPv4 only)", dst, syscall.ENETUNREACH)
	}
	c, err := d.net.DialContextTCPAddrPort(ctx, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
	if err != nil {
		return nil, errnoFor(err)
	}
	return c, nil
}

func (d *stackDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	if !dst.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("udp to %v: %w (the tunnel carries IPv4 only)", dst, syscall.ENETUNREACH)
	}
	c, err := d.net.DialUDPAddrPort(netip.AddrPort{}, netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()))
	if err != nil {
		return nil, errnoFor(err)
	}
	return c, nil
}

func (d *stackDialer) ListenUDP(ctx context.Context, v6 bool) (net.PacketConn, error) {
	if v6 {
		return nil, fmt.Errorf("udp: %w (the tunnel carries IPv4 only)", syscall.ENETUNREACH)
	}
	c, err := d.net.ListenUDPAddrPort(netip.AddrPortFrom(d.addr, 0))
	if err != nil {
		return nil, errnoFor(err)
	}
	return c, nil
}

func (d *stackDialer) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	ss, err := d.net.LookupContextHost(ctx, name)
	if err != nil {
		return nil, &net.DNSError{Err: err.Error(), Name: name, IsNotFound: strings.Contains(err.Error(), "no such host")}
	}
	var out []netip.Addr
	for _, s := range ss {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out, nil
}
