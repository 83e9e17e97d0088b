// SPDX-License-Identifier: MIT

package proxy

import (
	"net"
	"net/netip"
	"os"
	"testing"
)

// TestSocketOwner asks the kernel for the owner of this process's own TCP
// and UDP sockets (connected and unconnected, IPv4 and IPv6) and for a
// socket that does not exist.
func TestSocketOwner(t *testing.T) {
	me := uint32(os.Getuid())
	for _, lo := range []string{"127.0.0.1", "::1"} {
		l, err := net.Listen("tcp", net.JoinHostPort(lo, "0"))
		if err != nil {
			t.Skipf("%s: %v", lo, err)
		}
		defer l.Close()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		a, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		cl := netip.MustParseAddrPort(c.LocalAddr().String())
		sv := netip.MustParseAddrPort(l.Addr().String())
		if uid, err := SocketOwner("tcp", cl, sv); err != nil || uid != me {
			t.Errorf("tcp client %v: uid %d, %v; want %d", cl, uid, err, me)
		}
		if uid, err := SocketOwner("tcp", sv, cl); err != nil || uid != me {
			t.Errorf("tcp server side %v: uid %d, %v; want %d", sv, uid, err, me)
		}
		any := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
		if sv.Addr().Is6() {
			any = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
		}
		if uid, err := SocketOwner("tcp", sv, any); err != nil || uid != me {
			t.Errorf("tcp listener %v: uid %d, %v; want %d", sv, uid, err, me)
		}
		if _, err := SocketOwner("tcp", netip.AddrPortFrom(cl.Addr(), cl.Port()+1), sv); err == nil {
			t.Errorf("tcp: found a socket that does not exist")
		}

		u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(lo), 0)))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		r, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(lo), 0)))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		ua := netip.MustParseAddrPort(u.LocalAddr().String())
		ra := netip.MustParseAddrPort(r.LocalAddr().String())
		if uid, err := SocketOwner("udp", ua, ra); err != nil || uid != me {
			t.Errorf("unconnected udp %v: uid %d, %v; want %d", ua, uid, err, me)
		}
		cu, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ra))
		if err != nil {
			t.Fatal(err)
		}
		defer cu.Close()
		ca := netip.MustParseAddrPort(cu.LocalAddr().String())
		if uid, err := SocketOwner("udp", ca, ra); err != nil || uid != me {
			t.Errorf("connected udp %v: uid %d, %v; want %d", ca, uid, err, me)
		}
		if uid, err := SocketOwner("udp", ca, ua); err != nil || uid != me {
			t.Errorf("udp %v connected elsewhere: uid %d, %v; want %d", ca, uid, err, me)
		}
		if _, err := SocketOwner("udp", netip.AddrPortFrom(ua.Addr(), 1), ra); err == nil {
			t.Errorf("udp: found a socket that does not exist")
		}
	}
}
