// SPDX-License-Identifier: MIT

package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// SOCKS5 constants (RFC 1928, RFC 1929).
const (
	socksVersion   = 5
	authUserPass   = 2
	authNoAccept   = 0xff
	userPassVer    = 1
	CmdConnect     = 1
	CmdUDPAssoc    = 3
	atypIPv4       = 1
	atypDomain     = 3
	atypIPv6       = 4
	repOK          = 0
	repFailure     = 1
	repNetUnreach  = 3
	repHostUnreach = 4
	repRefused     = 5
	repTTLExpired  = 6
	repCmdUnsupp   = 7
	repAtypUnsupp  = 8
)

// CmdUDPRelay is Airlock's SOCKS5 extension command: after DST.ADDR and
// DST.PORT (the destination) the request carries a second address, the
// client's own UDP source (ATYP, ADDR, PORT, on loopback). The reply's
// BND.ADDR:BND.PORT is a loopback UDP socket connected to that source that
// relays plain datagrams to and from the destination through the tunnel,
// for as long as the TCP connection stays open. The preload library uses it
// so the job's connected UDP socket needs no SOCKS header per datagram.
const CmdUDPRelay = 0x83

// SOCKS is a SOCKS5 server for one job. Its zero value is not usable; fill
// the fields and call Serve. It is safe for concurrent use.
type SOCKS struct {
	Dialer Dialer
	// Secret is the password every client must present (any username).
	Secret string
	// Peers admits the local sockets that may use the proxy: its
	// connections and the datagrams of its UDP associations and relays.
	// Nil means OwnerUID of this process's uid (the job's).
	Peers  Peers
	Logger *slog.Logger

	logLimit *rate.Limiter
	once     sync.Once
}

func (s *SOCKS) init() {
	s.once.Do(func() { s.logLimit = rate.NewLimiter(rate.Every(time.Second), 5) })
}

// Serve accepts connections on l until it is closed; it returns nil then.
func (s *SOCKS) Serve(ctx context.Context, l net.Listener) error {
	s.init()
	l = &peerListener{Listener: l, peers: s.Peers, log: s.Logger, limit: s.logLimit}
	for {
		c, err := l.Accept()
		if err != nil {
			if isClosed(err) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("socks accept: %w", err)
		}
		go func() {
			if err := s.serveConn(ctx, c); err != nil && s.logLimit.Allow() {
				s.Logger.Debug("socks connection", "client", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

func (s *SOCKS) serveConn(ctx context.Context, c net.Conn) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	if err := s.authenticate(br, c); err != nil {
		return err
	}
	cmd, dst, err := readRequest(br)
	if err != nil {
		if errors.Is(err, errAtyp) {
			_ = writeReply(c, repAtypUnsupp, netip.AddrPort{})
		}
		return err
	}
	switch cmd {
	case CmdConnect:
		return s.connect(ctx, c, br, dst)
	case CmdUDPAssoc:
		return s.associate(ctx, c, br, dst)
	case CmdUDPRelay:
		src, err := readAddr(br)
		if err != nil {
			return err
		}
		return s.udpRelay(ctx, c, br, dst, src)
	default:
		_ = writeReply(c, repCmdUnsupp, netip.AddrPort{})
		return fmt.Errorf("%w: command %d not supported", ErrProtocol, cmd)
	}
}

// authenticate runs method negotiation and RFC 1929 username/password.
func (s *SOCKS) authenticate(br *bufio.Reader, w io.Writer) error {
	var hdr [2]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return fmt.Errorf("%w: greeting: %v", ErrProtocol, err)
	}
	if hdr[0] != socksVersion {
		return fmt.Errorf("%w: version %d", ErrProtocol, hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return fmt.Errorf("%w: methods: %v", ErrProtocol, err)
	}
	ok := false
	for _, m := range methods {
		ok = ok || m == authUserPass
	}
	if !ok {
		_, _ = w.Write([]byte{socksVersion, authNoAccept})
		return fmt.Errorf("%w: client offers no username/password method", ErrAuth)
	}
	if _, err := w.Write([]byte{socksVersion, authUserPass}); err != nil {
		return err
	}
	var v [2]byte
	if _, err := io.ReadFull(br, v[:]); err != nil || v[0] != userPassVer {
		return fmt.Errorf("%w: bad username/password request", ErrProtocol)
	}
	user := make([]byte, v[1])
	if _, err := io.ReadFull(br, user); err != nil {
		return fmt.Errorf("%w: username: %v", ErrProtocol, err)
	}
	plen, err := br.ReadByte()
	if err != nil {
		return fmt.Errorf("%w: password: %v", ErrProtocol, err)
	}
	pass := make([]byte, plen)
	if _, err := io.ReadFull(br, pass); err != nil {
		return fmt.Errorf("%w: password: %v", ErrProtocol, err)
	}
	if !secretOK(string(pass), s.Secret) {
		_, _ = w.Write([]byte{userPassVer, 1})
		return ErrAuth
	}
	_, err = w.Write([]byte{userPassVer, 0})
	return err
}

var errAtyp = fmt.Errorf("%w: address type not supported", ErrProtocol)

// socksAddr is a request's address: an IP or a domain name, and a port.
type socksAddr struct {
	ip   netip.Addr
	host string
	port uint16
}

func (a socksAddr) String() string {
	if a.ip.IsValid() {
		return netip.AddrPortFrom(a.ip, a.port).String()
	}
	return net.JoinHostPort(a.host, strconv.Itoa(int(a.port)))
}

func readRequest(br *bufio.Reader) (cmd byte, dst socksAddr, err error) {
	var h [3]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, dst, fmt.Errorf("%w: request: %v", ErrProtocol, err)
	}
	if h[0] != socksVersion {
		return 0, dst, fmt.Errorf("%w: request version %d", ErrProtocol, h[0])
	}
	dst, err = readAddr(br)
	return h[1], dst, err
}

// readAddr reads ATYP, ADDR, PORT.
func readAddr(r io.Reader) (socksAddr, error) {
	var a socksAddr
	var t [1]byte
	if _, err := io.ReadFull(r, t[:]); err != nil {
		return a, fmt.Errorf("%w: address: %v", ErrProtocol, err)
	}
	switch t[0] {
	case atypIPv4:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return a, fmt.Errorf("%w: address: %v", ErrProtocol, err)
		}
		a.ip = netip.AddrFrom4(b)
	case atypIPv6:
		var b [16]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return a, fmt.Errorf("%w: address: %v", ErrProtocol, err)
		}
		a.ip = netip.AddrFrom16(b).Unmap()
	case atypDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return a, fmt.Errorf("%w: address: %v", ErrProtocol, err)
		}
		b := make([]byte, n[0])
		if _, err := io.ReadFull(r, b); err != nil {
			return a, fmt.Errorf("%w: address: %v", ErrProtocol, err)
		}
		if n[0] == 0 {
			return a, fmt.Errorf("%w: empty domain name", ErrProtocol)
		}
		a.host = string(b)
	default:
		return a, errAtyp
	}
	var p [2]byte
	if _, err := io.ReadFull(r, p[:]); err != nil {
		return a, fmt.Errorf("%w: port: %v", ErrProtocol, err)
	}
	a.port = binary.BigEndian.Uint16(p[:])
	return a, nil
}

// appendAddr appends ATYP, ADDR, PORT for ap.
func appendAddr(b []byte, ap netip.AddrPort) []byte {
	a := ap.Addr().Unmap()
	switch {
	case a.Is4():
		b = append(b, atypIPv4)
		v := a.As4()
		b = append(b, v[:]...)
	case a.Is6():
		b = append(b, atypIPv6)
		v := a.As16()
		b = append(b, v[:]...)
	default:
		b = append(b, atypIPv4, 0, 0, 0, 0)
	}
	return binary.BigEndian.AppendUint16(b, ap.Port())
}

func writeReply(w io.Writer, rep byte, bnd netip.AddrPort) error {
	_, err := w.Write(appendAddr([]byte{socksVersion, rep, 0}, bnd))
	return err
}

// replyCode maps a dial or lookup error to a SOCKS5 reply code.
func replyCode(err error) byte {
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr):
		return repHostUnreach
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return repRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return repNetUnreach
	case errors.Is(err, syscall.EHOSTUNREACH):
		return repHostUnreach
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return repTTLExpired
	}
	return repFailure
}

func (s *SOCKS) target(ctx context.Context, a socksAddr) (netip.AddrPort, error) {
	if a.ip.IsValid() {
		return netip.AddrPortFrom(a.ip, a.port), nil
	}
	ip, err := resolve(ctx, s.Dialer, a.host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(ip, a.port), nil
}

func (s *SOCKS) connect(ctx context.Context, c net.Conn, br *bufio.Reader, a socksAddr) error {
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	host := a.host
	if a.ip.IsValid() {
		host = a.ip.String()
	}
	rc, err := dialHost(dctx, s.Dialer, host, a.port)
	if err != nil {
		_ = writeReply(c, replyCode(err), netip.AddrPort{})
		return fmt.Errorf("connect %s: %w", a, err)
	}
	bnd, _ := netip.ParseAddrPort(rc.LocalAddr().String())
	if err := writeReply(c, repOK, bnd); err != nil {
		rc.Close()
		return err
	}
	_ = c.SetDeadline(time.Time{})
	// Bytes the client sent right after the request (optimistic data) sit
	// in br.
	Splice(&bufferedConn{Conn: c, r: br}, rc)
	return nil
}

// bufferedConn reads through a bufio.Reader that may hold early bytes.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *bufferedConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return b.Conn.Close()
}

// loopbackFor returns the loopback address of the family of c's local
// address.
func loopbackFor(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.LocalAddr().String()); err == nil && ap.Addr().Is6() && !ap.Addr().Is4In6() {
		return netip.IPv6Loopback()
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1})
}

// associate serves UDP ASSOCIATE: datagrams with the RFC 1928 header from
// the client go to their destination through the association's own
// tunnel sockets; answers come back with the header naming their source.
// The association ends when the TCP connection closes. Its relay socket is
// its own, and only one socket of the job may use it: the first whose
// datagram comes from the client's host, from the port the request named
// (if it named one, as RFC 1928 lets it), and from a socket that Peers
// admits (the kernel names its owner: another user on the node cannot
// claim the association, even by sending first).
func (s *SOCKS) associate(ctx context.Context, c net.Conn, br *bufio.Reader, req socksAddr) error {
	client, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	lc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(loopbackFor(c), 0)))
	if err != nil {
		_ = writeReply(c, repFailure, netip.AddrPort{})
		return fmt.Errorf("udp associate: %w", err)
	}
	defer lc.Close()
	bnd, _ := netip.ParseAddrPort(lc.LocalAddr().String())
	if err := writeReply(c, repOK, bnd); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Time{})
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	peers := defaultPeers(s.Peers)

	var mu sync.Mutex
	var peer netip.AddrPort             // the client's UDP socket, once one has been admitted
	tunnels := map[int]net.PacketConn{} // by ipfamily.Family.Index
	defer func() {
		mu.Lock()
		for _, pc := range tunnels {
			pc.Close()
		}
		mu.Unlock()
	}()
	back := func(pc net.PacketConn) {
		buf := make([]byte, 65536)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			src, err := netip.ParseAddrPort(from.String())
			if err != nil {
				continue
			}
			out := appendUDPHeader(make([]byte, 0, n+22), netip.AddrPortFrom(src.Addr().Unmap(), src.Port()))
			out = append(out, buf[:n]...)
			mu.Lock()
			p := peer
			mu.Unlock()
			if p.IsValid() {
				_, _ = lc.WriteToUDPAddrPort(out, p)
			}
		}
	}
	go func() {
		// The TCP connection's end (or any byte on it) ends the association.
		_, _ = io.Copy(io.Discard, br)
		cancel()
		lc.Close()
	}()
	refused := 0
	buf := make([]byte, 65536)
	for {
		n, from, err := lc.ReadFromUDPAddrPort(buf)
		if err != nil {
			return nil
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		mu.Lock()
		p := peer
		mu.Unlock()
		if !p.IsValid() {
			if from.Addr() != client.Addr().Unmap() || (req.port != 0 && from.Port() != req.port) {
				continue // only the client's host, and its announced port, may use the association
			}
			if err := peers.UDP(from, bnd); err != nil {
				if refused++; refused <= 3 && s.logLimit.Allow() {
					s.Logger.Warn("udp associate: refused a datagram of another user", "err", err)
				}
				continue
			}
			mu.Lock()
			peer, p = from, from
			mu.Unlock()
		}
		if from != p {
			continue
		}
		a, payload, err := parseUDPDatagram(buf[:n])
		if err != nil {
			continue
		}
		dst, err := s.target(actx, a)
		if err != nil {
			continue
		}
		f := ipfamily.Of(dst.Addr())
		mu.Lock()
		pc := tunnels[f.Index]
		mu.Unlock()
		if pc == nil {
			pc, err = s.Dialer.ListenUDP(actx, f)
			if err != nil {
				if s.logLimit.Allow() {
					s.Logger.Debug("udp associate: open tunnel socket", "err", err)
				}
				continue
			}
			mu.Lock()
			tunnels[f.Index] = pc
			mu.Unlock()
			go back(pc)
		}
		_, _ = pc.WriteTo(payload, net.UDPAddrFromAddrPort(dst))
	}
}

// parseUDPDatagram splits a UDP ASSOCIATE datagram (RFC 1928 section 7:
// RSV RSV FRAG ATYP DST.ADDR DST.PORT DATA) into its destination and
// payload. Fragments (FRAG != 0) are not supported.
func parseUDPDatagram(b []byte) (socksAddr, []byte, error) {
	if len(b) < 4 {
		return socksAddr{}, nil, fmt.Errorf("%w: udp datagram of %d bytes", ErrProtocol, len(b))
	}
	if b[2] != 0 {
		return socksAddr{}, nil, fmt.Errorf("%w: udp fragment %d", ErrProtocol, b[2])
	}
	r := &sliceReader{b: b[3:]}
	a, err := readAddr(r)
	if err != nil {
		return socksAddr{}, nil, err
	}
	return a, r.b, nil
}

// appendUDPHeader appends the RFC 1928 UDP header naming src.
func appendUDPHeader(b []byte, src netip.AddrPort) []byte {
	return appendAddr(append(b, 0, 0, 0), src)
}

// sliceReader reads from a byte slice and leaves the rest in b.
type sliceReader struct{ b []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// udpRelay serves CmdUDPRelay.
func (s *SOCKS) udpRelay(ctx context.Context, c net.Conn, br *bufio.Reader, a, src socksAddr) error {
	if !src.ip.IsValid() || !src.ip.IsLoopback() {
		_ = writeReply(c, repFailure, netip.AddrPort{})
		return fmt.Errorf("%w: udp relay source %s is not a loopback address", ErrProtocol, src)
	}
	dctx, cancel := context.WithTimeout(ctx, DialTimeout)
	dst, err := s.target(dctx, a)
	cancel()
	if err != nil {
		_ = writeReply(c, replyCode(err), netip.AddrPort{})
		return err
	}
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	r, err := newUDPRelay(rctx, s.Dialer, netip.AddrPortFrom(src.ip, src.port), dst, 0)
	if err != nil {
		_ = writeReply(c, replyCode(err), netip.AddrPort{})
		return err
	}
	defer r.Close()
	// The relay's socket is connected to src, so only src can use it:
	// src must be the job's.
	if err := defaultPeers(s.Peers).UDP(netip.AddrPortFrom(src.ip, src.port), r.Addr()); err != nil {
		_ = writeReply(c, repFailure, netip.AddrPort{})
		return fmt.Errorf("udp relay: %w", err)
	}
	if err := writeReply(c, repOK, r.Addr()); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Time{})
	_, _ = io.Copy(io.Discard, br) // until the client closes the connection
	return nil
}
