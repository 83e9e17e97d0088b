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
	// ListenUDP opens an unconnected UDP socket (any local port) of dst's
	// family.
	ListenUDP(ctx context.Context, v6 bool) (net.PacketConn, error)
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

// resolve turns host (an IP literal or a name) into one address, asking
// the tunnel's DNS for names. IPv4 answers are preferred: the tunnel's
// lease is IPv4.
func resolve(ctx context.Context, d Dialer, host string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), nil
	}
	addrs, err := d.LookupHost(ctx, host)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if a.Unmap().Is4() {
			return a.Unmap(), nil
		}
	}
	if len(addrs) == 0 {
		return netip.Addr{}, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	return addrs[0], nil
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
