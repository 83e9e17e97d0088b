// SPDX-License-Identifier: MIT

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FuzzReadRequest feeds arbitrary bytes to the SOCKS5 request parser (what
// any local process may send once authenticated): it must not panic, and a
// parsed address must be an IP or a non-empty name.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte{5, 1, 0, 1, 192, 0, 2, 1, 0, 80})
	f.Add([]byte{5, 3, 0, 3, 4, 'a', '.', 'b', 'c', 0, 53})
	f.Add([]byte{5, 0x83, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 7, 1, 127, 0, 0, 1, 4, 0})
	f.Add([]byte{5, 1, 0, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		_, a, err := readRequest(br)
		if err != nil {
			return
		}
		if !a.ip.IsValid() && a.host == "" {
			t.Fatalf("parsed %+v from %x: neither IP nor name", a, b)
		}
		_, _ = readAddr(br) // the relay command's source address
	})
}

// FuzzParseUDPDatagram feeds arbitrary datagrams to the UDP ASSOCIATE
// header parser (what the job's socket sends to the association).
// Invariants: an accepted datagram names an IP or a name, and the header
// encoded again from an IP destination is exactly the input's prefix.
func FuzzParseUDPDatagram(f *testing.F) {
	f.Add(append(appendUDPHeader(nil, netip.MustParseAddrPort("192.0.2.1:53")), "query"...))
	f.Add(append(appendUDPHeader(nil, netip.MustParseAddrPort("[2001:db8::1]:443")), 1, 2, 3))
	f.Add([]byte{0, 0, 0, atypDomain, 3, 'a', '.', 'b', 0, 53, 'x'})
	f.Add([]byte{0, 0, 1, atypIPv4, 1, 2, 3, 4, 0, 1})
	f.Add([]byte{0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, payload, err := parseUDPDatagram(b)
		if err != nil {
			return
		}
		if !a.ip.IsValid() && a.host == "" {
			t.Fatalf("parsed %+v from %x: neither IP nor name", a, b)
		}
		if len(payload) > len(b)-4 || !bytes.HasSuffix(b, payload) {
			t.Fatalf("payload %x is not the tail of %x", payload, b)
		}
		hdr := b[:len(b)-len(payload)]
		switch b[3] {
		case atypIPv4, atypIPv6:
			again := appendUDPHeader(nil, netip.AddrPortFrom(a.ip, a.port))
			mapped := b[3] == atypIPv6 && a.ip.Is4()         // ::ffff:a.b.c.d is read as IPv4
			if !mapped && !bytes.Equal(hdr[2:], again[2:]) { // RSV is ignored
				t.Fatalf("header %x encodes back as %x", hdr, again)
			}
		case atypDomain:
			if a.ip.IsValid() || len(a.host) != int(b[4]) || len(hdr) != 7+len(a.host) {
				t.Fatalf("domain header %x parsed as %+v", hdr, a)
			}
		default:
			t.Fatalf("accepted address type %d", b[3])
		}
	})
}

// fuzzDialer is the tunnel of the fuzzed proxies: it records every
// destination and refuses every connection; one name resolves.
type fuzzDialer struct {
	mu    sync.Mutex
	dials []netip.AddrPort
}

func (d *fuzzDialer) record(dst netip.AddrPort) {
	d.mu.Lock()
	d.dials = append(d.dials, dst)
	d.mu.Unlock()
}

func (d *fuzzDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	d.record(dst)
	return nil, syscall.ECONNREFUSED
}

func (d *fuzzDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	d.record(dst)
	return nil, syscall.ECONNREFUSED
}

func (d *fuzzDialer) ListenUDP(ctx context.Context, _ *ipfamily.Family) (net.PacketConn, error) {
	return nil, syscall.EACCES
}

func (d *fuzzDialer) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	if name == "ok.test" {
		return []netip.Addr{netip.MustParseAddr("192.0.2.9")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

// anyPeer admits every socket (the fuzzed connections are not sockets).
type anyPeer struct{}

func (anyPeer) TCP(peer, local netip.AddrPort) error { return nil }
func (anyPeer) UDP(peer, local netip.AddrPort) error { return nil }

// scriptConn is a net.Conn that reads a fixed input and records what is
// written.
type scriptConn struct {
	r   *bytes.Reader
	out bytes.Buffer
}

func (c *scriptConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error) { return c.out.Write(p) }
func (c *scriptConn) Close() error                { return nil }
func (c *scriptConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1080}
}
func (c *scriptConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
func (c *scriptConn) SetDeadline(t time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(t time.Time) error { return nil }

const fuzzSecret = "0123456789abcdef0123456789abcdef"

// socksHello is a client's greeting and authentication with secret.
func socksHello(secret string) []byte {
	b := []byte{5, 1, authUserPass, userPassVer, 1, 'u', byte(len(secret))}
	return append(b, secret...)
}

// FuzzSOCKSConn runs a whole SOCKS5 conversation (greeting,
// authentication, request, and for a UDP association its end) from
// arbitrary client bytes. Invariants: nothing is dialled or resolved
// unless the client authenticated with the secret; every dial goes to the
// port the request named; the server's bytes are well-formed replies.
func FuzzSOCKSConn(f *testing.F) {
	ok := socksHello(fuzzSecret)
	f.Add(append(append([]byte{}, ok...), 5, CmdConnect, 0, atypIPv4, 192, 0, 2, 1, 0, 80))
	f.Add(append(append([]byte{}, ok...), 5, CmdConnect, 0, atypDomain, 7, 'o', 'k', '.', 't', 'e', 's', 't', 1, 187))
	f.Add(append(append([]byte{}, ok...), 5, CmdUDPAssoc, 0, atypIPv4, 0, 0, 0, 0, 0, 0))
	f.Add(append(append([]byte{}, ok...), 5, CmdUDPRelay, 0, atypIPv4, 192, 0, 2, 1, 0, 53, atypIPv4, 127, 0, 0, 1, 0x9c, 0x40))
	f.Add(append(socksHello("wrong"), 5, CmdConnect, 0, atypIPv4, 192, 0, 2, 1, 0, 80))
	f.Add([]byte{5, 1, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		d := &fuzzDialer{}
		s := &SOCKS{Dialer: d, Secret: fuzzSecret, Peers: anyPeer{}, Logger: discard}
		s.init()
		c := &scriptConn{r: bytes.NewReader(in)}
		_ = s.serveConn(context.Background(), c)
		out := c.out.Bytes()
		authed := bytes.HasPrefix(out, []byte{5, authUserPass, userPassVer, 0})
		if len(d.dials) > 0 && !authed {
			t.Fatalf("dialled %v without authentication (server said %x)", d.dials, out)
		}
		if len(out) >= 2 && (out[0] != 5 || (out[1] != authUserPass && out[1] != authNoAccept)) {
			t.Fatalf("method reply %x", out[:2])
		}
		if !authed {
			return
		}
		rest := out[4:]
		if len(rest) > 0 {
			if len(rest) < 10 || rest[0] != 5 || rest[2] != 0 {
				t.Fatalf("request reply %x", rest)
			}
		}
		// Every dial is to the request's port.
		br := bufio.NewReader(bytes.NewReader(in[len(fuzzHelloPrefix(in)):]))
		_, req, err := readRequest(br)
		for _, dst := range d.dials {
			if err != nil || dst.Port() != req.port {
				t.Fatalf("dialled %v for request %+v (%v)", dst, req, err)
			}
		}
	})
}

// fuzzHelloPrefix returns the greeting and authentication at the start of
// in (which the server accepted).
func fuzzHelloPrefix(in []byte) []byte {
	n := 2 + int(in[1])
	n += 2 + int(in[n+1])
	n += 1 + int(in[n])
	return in[:n]
}

// FuzzHTTPProxy sends an arbitrary HTTP request (whatever net/http
// parses) to the HTTP proxy. Invariants: without the secret it answers
// 407 and dials nothing; it dials only the port the request names (443
// for CONNECT without one is refused by the parser, 80 for http://
// without one); errors are 4xx or 502, never 500.
func FuzzHTTPProxy(f *testing.F) {
	auth := "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+fuzzSecret)) + "\r\n"
	f.Add([]byte("CONNECT 192.0.2.1:443 HTTP/1.1\r\nHost: 192.0.2.1:443\r\n" + auth + "\r\n"))
	f.Add([]byte("CONNECT ok.test:22 HTTP/1.1\r\nHost: ok.test:22\r\n" + auth + "\r\n"))
	f.Add([]byte("GET http://ok.test/x HTTP/1.1\r\nHost: ok.test\r\n" + auth + "\r\n"))
	f.Add([]byte("GET http://192.0.2.1:8080/ HTTP/1.1\r\nHost: 192.0.2.1:8080\r\nProxy-Authorization: Basic dTp3cm9uZw==\r\n\r\n"))
	f.Add([]byte("GET /local HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return
		}
		d := &fuzzDialer{}
		h := &HTTP{Dialer: d, Secret: fuzzSecret, Peers: anyPeer{}, Logger: discard}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		h.CloseIdleConnections()
		if !h.authorized(req) {
			if rec.Code != http.StatusProxyAuthRequired || len(d.dials) > 0 {
				t.Fatalf("unauthenticated request: %d, dialled %v", rec.Code, d.dials)
			}
			return
		}
		if rec.Code == http.StatusInternalServerError || rec.Code < 400 {
			t.Fatalf("%s %s: status %d", req.Method, req.RequestURI, rec.Code)
		}
		host := req.Host
		if req.Method != http.MethodConnect {
			host = req.URL.Host
		}
		want := ""
		if _, p, err := net.SplitHostPort(host); err == nil {
			want = p
		} else if req.Method != http.MethodConnect {
			want = "80"
		}
		for _, dst := range d.dials {
			if strconv.Itoa(int(dst.Port())) != want {
				t.Fatalf("%s %q: dialled %v", req.Method, host, dst)
			}
		}
	})
}

var discard = slog.New(slog.DiscardHandler)
