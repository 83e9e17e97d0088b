// SPDX-License-Identifier: MIT

// Package proxy serves the local proxies of airlock run's fallback modes and
// the loopback plumbing that hands intercepted sockets to the tunnel.
//
// Everything here dials through a [Dialer] — in airlock run, the client-side
// user-space TCP/IP stack attached to the job's WireGuard device — so every
// connection leaves through the gateway with the job's tunnel address,
// policy and port block, exactly like one from a netns job.
//
//   - [SOCKS]: SOCKS5 (RFC 1928) on loopback with username/password
//     authentication (RFC 1929) against a per-job secret: CONNECT, UDP
//     ASSOCIATE, domain names resolved through the tunnel (remote DNS), and
//     one Airlock extension, CmdUDPRelay, that gives the preload library a
//     loopback UDP port relaying to one fixed destination, so that the
//     job's own connected UDP socket needs no per-datagram header.
//   - [HTTP]: an HTTP proxy on loopback (CONNECT and absolute-URI forward
//     requests), Proxy-Authorization Basic with the same secret.
//   - [PipeTCP], [PipeUDP]: a loopback socket whose other end is relayed to
//     a tunnel connection, for the seccomp mode to inject into the job.
//
// Two locks keep other users of the node out, since loopback ports are
// open to every local user: the secret, which only the job's environment
// holds (in the proxy URLs; readable only by the job's own user), and
// [Peers], which admits only sockets owned by the job's uid as the kernel
// reports it ([SocketOwner]) — for connections to the proxies, for the
// datagrams of a UDP association, which carry no secret, and for
// [DialOwned], the way to an exposed port's loopback listener.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Dialer opens connections through the tunnel. Implementations must be safe
// for concurrent use.
type Dialer interface {
	// DialTCP opens a TCP connection to dst.
	DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error)
	// DialUDP opens a UDP socket connected to dst.
	DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error)
	// ListenUDP opens an unconnected UDP socket (any local port) of
	// address family f.
	ListenUDP(ctx context.Context, f *ipfamily.Family) (net.PacketConn, error)
	// LookupHost resolves name through the tunnel's DNS server.
	LookupHost(ctx context.Context, name string) ([]netip.Addr, error)
}

// NewSecret returns a fresh random secret for one job's proxies: 32 hex
// digits, safe in URLs and SOCKS usernames.
func NewSecret() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// secretOK compares a presented secret in constant time.
func secretOK(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// UDPIdleTimeout is how long a UDP relay or association without traffic
// lives (the gateway's own UDP flows time out after a similar idle time).
const UDPIdleTimeout = 2 * time.Minute

// DialTimeout bounds a TCP dial through the tunnel.
const DialTimeout = 30 * time.Second

// resolveAll turns host (an IPv4 or IPv6 literal, or a name) into the
// addresses to try, in order, asking the tunnel's DNS for names: the
// Dialer's LookupHost orders them (IPv6 first when the tunnel carries
// IPv6). IPv4-mapped addresses count as IPv4; zones are dropped.
func resolveAll(ctx context.Context, d Dialer, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap().WithZone("")}, nil
	}
	addrs, err := d.LookupHost(ctx, host)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	out := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		out[i] = a.Unmap().WithZone("")
	}
	return out, nil
}

// resolve is resolveAll's first address (for UDP, which cannot tell a
// dead address from a quiet one).
func resolve(ctx context.Context, d Dialer, host string) (netip.Addr, error) {
	addrs, err := resolveAll(ctx, d, host)
	if err != nil {
		return netip.Addr{}, err
	}
	return addrs[0], nil
}

// FallbackDelay bounds each attempt but the last when a name has several
// addresses: a dual-stack name whose IPv6 path is dead falls back to IPv4
// after this long (RFC 8305 races; a sequence with a bound is enough here).
const FallbackDelay = 5 * time.Second

// dialHost opens a TCP connection to host (a literal or a name) and port
// through d, trying the addresses in resolveAll's order until one
// connects; it returns the last error.
func dialHost(ctx context.Context, d Dialer, host string, port uint16) (net.Conn, error) {
	addrs, err := resolveAll(ctx, d, host)
	if err != nil {
		return nil, err
	}
	for i, a := range addrs {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if i < len(addrs)-1 {
			actx, cancel = context.WithTimeout(ctx, FallbackDelay)
		}
		var c net.Conn
		c, err = d.DialTCP(actx, netip.AddrPortFrom(a, port))
		cancel()
		if err == nil || ctx.Err() != nil {
			return c, err
		}
	}
	return nil, err
}

// Splice copies both ways between a and b with half-close (CloseWrite
// where dst has it, else Close) and returns when both directions are done;
// it closes both. It is the one copy-both-ways helper of the proxies and
// the client's exposed ports.
func Splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// isClosed reports whether err comes from using a closed listener or conn.
func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
