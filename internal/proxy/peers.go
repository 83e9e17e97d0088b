// SPDX-License-Identifier: MIT

package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"

	"golang.org/x/time/rate"
)

// Peers decides which local sockets may use a job's proxies and relays.
// Loopback addresses are shared by every user of the node, and a proxy
// secret only guards the streams that carry it (not the datagrams of a
// UDP association, nor an exposed port's loopback target), so every
// loopback peer is also checked against the job's uid, as the kernel
// reports the owner of the peer's socket. Implementations must be safe
// for concurrent use.
type Peers interface {
	// TCP returns nil if the TCP connection whose far end is peer and
	// whose near end is local (both as seen by the proxy's socket) is the
	// job's, an error wrapping ErrForeignPeer if it belongs to another
	// user.
	TCP(peer, local netip.AddrPort) error
	// UDP returns nil if the UDP socket bound at peer, which sent to or
	// will receive from local, is the job's, an error wrapping
	// ErrForeignPeer if it belongs to another user.
	UDP(peer, local netip.AddrPort) error
}

// ErrForeignPeer is returned by Peers for a socket of another user (or
// one that does not exist any more).
var ErrForeignPeer = errors.New("socket not owned by the job's user")

// OwnerUID admits the sockets owned by one uid, asking the kernel
// (sock_diag) who owns each. It is the Peers used when none is given, with
// the uid of airlock run, which is the job's.
type OwnerUID uint32

// TCP implements Peers.
func (u OwnerUID) TCP(peer, local netip.AddrPort) error {
	return u.check("tcp", peer, local)
}

// UDP implements Peers.
func (u OwnerUID) UDP(peer, local netip.AddrPort) error {
	return u.check("udp", peer, local)
}

func (u OwnerUID) check(network string, peer, local netip.AddrPort) error {
	uid, err := SocketOwner(network, peer, local)
	if err != nil {
		return fmt.Errorf("%w: %s socket %v: %v", ErrForeignPeer, network, peer, err)
	}
	if uid != uint32(u) {
		return fmt.Errorf("%w: %s socket %v belongs to uid %d", ErrForeignPeer, network, peer, uid)
	}
	return nil
}

// defaultPeers is the Peers of a proxy that was given none.
func defaultPeers(p Peers) Peers {
	if p != nil {
		return p
	}
	return OwnerUID(uint32(os.Getuid()))
}

// checkTCPPeer checks an accepted loopback connection with p (nil: the
// default).
func checkTCPPeer(p Peers, c net.Conn) error {
	peer, err1 := netip.ParseAddrPort(c.RemoteAddr().String())
	local, err2 := netip.ParseAddrPort(c.LocalAddr().String())
	if err1 != nil || err2 != nil {
		return fmt.Errorf("%w: connection %v → %v", ErrForeignPeer, c.RemoteAddr(), c.LocalAddr())
	}
	return defaultPeers(p).TCP(peer, local)
}

// peerListener is a listener that closes, at once, the connections Peers
// does not admit.
type peerListener struct {
	net.Listener
	peers Peers
	log   *slog.Logger
	limit *rate.Limiter
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if err := checkTCPPeer(l.peers, c); err != nil {
			c.Close()
			if l.limit.Allow() {
				l.log.Warn("proxy: refused a connection of another user", "err", err)
			}
			continue
		}
		return c, nil
	}
}

// DialOwned connects to the loopback TCP service at dst (an exposed port's
// target) only if its socket is one Peers admits (nil: this process's
// uid): the listening socket is checked before connecting, so another
// user's service never sees the connection, and the accepted socket again
// after, before any byte is sent.
func DialOwned(ctx context.Context, p Peers, dst netip.AddrPort) (net.Conn, error) {
	p = defaultPeers(p)
	any := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if dst.Addr().Is6() {
		any = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
	}
	if err := p.TCP(dst, any); err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	peer, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	local, _ := netip.ParseAddrPort(c.LocalAddr().String())
	if err := p.TCP(peer, local); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
