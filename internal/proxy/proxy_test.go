// SPDX-License-Identifier: MIT

package proxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/proxy/proxytest"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	xproxy "golang.org/x/net/proxy"
)

// hostDialer dials with the host's own stack; names come from a map.
type hostDialer struct{ names map[string]netip.Addr }

func (d hostDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", dst.String())
}

func (d hostDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "udp", dst.String())
}

func (d hostDialer) ListenUDP(ctx context.Context, _ *ipfamily.Family) (net.PacketConn, error) {
	return net.ListenPacket("udp4", "127.0.0.1:0")
}

func (d hostDialer) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	if a, ok := d.names[name]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

var testDialer = hostDialer{names: map[string]netip.Addr{"echo.test": netip.MustParseAddr("127.0.0.1")}}

// echoServers starts a TCP and a UDP echo server on loopback.
func echoServers(t *testing.T) (tcp, udp netip.AddrPort) {
	return proxytest.TCPServer(t, proxytest.Echo), proxytest.UDPEcho(t, "")
}

func startSOCKS(t *testing.T) (addr string, secret string) {
	secret, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &SOCKS{Dialer: testDialer, Secret: secret, Logger: slog.New(slog.DiscardHandler)}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); l.Close(); <-done })
	return l.Addr().String(), secret
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != msg {
		t.Fatalf("echo %q, want %q", buf, msg)
	}
}

func TestSOCKSConnect(t *testing.T) {
	tcpEcho, _ := echoServers(t)
	addr, secret := startSOCKS(t)
	for _, tc := range []struct {
		name, target string
		pass         string
		ok           bool
	}{
		{"ip", tcpEcho.String(), secret, true},
		{"remote-dns", net.JoinHostPort("echo.test", fmt.Sprint(tcpEcho.Port())), secret, true},
		{"unknown-name", "nx.test:80", secret, false},
		{"wrong-secret", tcpEcho.String(), "x" + secret, false},
		{"refused", "127.0.0.1:1", secret, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := xproxy.SOCKS5("tcp", addr, &xproxy.Auth{User: "job", Password: tc.pass}, xproxy.Direct)
			if err != nil {
				t.Fatal(err)
			}
			c, err := d.Dial("tcp", tc.target)
			if (err == nil) != tc.ok {
				t.Fatalf("dial %s: err %v, want ok=%v", tc.target, err, tc.ok)
			}
			if err == nil {
				defer c.Close()
				roundTrip(t, c, "hello through socks")
			}
		})
	}
}

func TestSOCKSNoAuthRefused(t *testing.T) {
	addr, _ := startSOCKS(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{5, 1, 0}); err != nil { // "no authentication" only
		t.Fatal(err)
	}
	var r [2]byte
	if _, err := io.ReadFull(c, r[:]); err != nil {
		t.Fatal(err)
	}
	if r != [2]byte{5, 0xff} {
		t.Fatalf("reply %v, want [5 255] (no acceptable method)", r)
	}
}

// socksHandshake authenticates on c and sends a request; it returns BND.
func socksHandshake(t *testing.T, c net.Conn, secret string, req []byte) netip.AddrPort {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := []byte{5, 1, 2, 1, 3, 'j', 'o', 'b', byte(len(secret))}
	msg = append(msg, secret...)
	msg = append(msg, req...)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var hdr [4]byte // method reply, auth reply
	if _, err := io.ReadFull(br, hdr[:]); err != nil || hdr != [4]byte{5, 2, 1, 0} {
		t.Fatalf("auth: %v %v", hdr, err)
	}
	var rep [3]byte
	if _, err := io.ReadFull(br, rep[:]); err != nil || rep[1] != 0 {
		t.Fatalf("request reply %v %v", rep, err)
	}
	a, err := readAddr(br)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(a.ip, a.port)
}

func TestSOCKSUDPAssociate(t *testing.T) {
	_, udpEcho := echoServers(t)
	addr, secret := startSOCKS(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bnd := socksHandshake(t, c, secret, []byte{5, CmdUDPAssoc, 0, atypIPv4, 0, 0, 0, 0, 0, 0})
	u, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(bnd))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for _, dst := range []string{"ip", "name"} {
		hdr := []byte{0, 0, 0}
		if dst == "ip" {
			hdr = appendAddr(hdr, udpEcho)
		} else {
			hdr = append(hdr, atypDomain, byte(len("echo.test")))
			hdr = append(hdr, "echo.test"...)
			hdr = binary.BigEndian.AppendUint16(hdr, udpEcho.Port())
		}
		payload := "datagram to " + dst
		got := ""
		for attempt := 0; attempt < 5 && got == ""; attempt++ {
			if _, err := u.Write(append(hdr, payload...)); err != nil {
				t.Fatal(err)
			}
			_ = u.SetReadDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 2048)
			n, err := u.Read(buf)
			if err != nil {
				continue
			}
			r := &sliceReader{b: buf[3:n]}
			src, err := readAddr(r)
			if err != nil {
				t.Fatal(err)
			}
			if netip.AddrPortFrom(src.ip, src.port) != udpEcho {
				t.Errorf("answer from %v, want %v", src, udpEcho)
			}
			got = string(r.b)
		}
		if got != payload {
			t.Errorf("echo %q, want %q", got, payload)
		}
	}
}

func TestSOCKSUDPRelay(t *testing.T) {
	_, udpEcho := echoServers(t)
	addr, secret := startSOCKS(t)
	u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	req := appendAddr([]byte{5, CmdUDPRelay, 0}, udpEcho)
	req = appendAddr(req, netip.MustParseAddrPort(u.LocalAddr().String()))
	bnd := socksHandshake(t, c, secret, req)
	got := ""
	for attempt := 0; attempt < 5 && got == ""; attempt++ {
		if _, err := u.WriteToUDPAddrPort([]byte("plain datagram"), bnd); err != nil {
			t.Fatal(err)
		}
		_ = u.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, 100)
		n, from, err := u.ReadFromUDPAddrPort(buf)
		if err == nil && from == bnd {
			got = string(buf[:n])
		}
	}
	if got != "plain datagram" {
		t.Fatalf("relay echo %q", got)
	}
	// Closing the control connection ends the relay.
	c.Close()
	time.Sleep(200 * time.Millisecond)
	_, _ = u.WriteToUDPAddrPort([]byte("after close"), bnd)
	_ = u.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, _, err := u.ReadFromUDPAddrPort(make([]byte, 100)); err == nil {
		t.Error("relay still answers after its control connection closed")
	}
}

func TestHTTPProxy(t *testing.T) {
	tcpEcho, _ := echoServers(t)
	web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "path=%s auth=%q", r.URL.Path, r.Header.Get("Proxy-Authorization"))
	})}
	wl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = web.Serve(wl) }()
	t.Cleanup(func() { web.Close() })
	webPort := netip.MustParseAddrPort(wl.Addr().String()).Port()

	secret, _ := NewSecret()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &HTTP{Dialer: testDialer, Secret: secret, Logger: slog.New(slog.DiscardHandler)}
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })

	get := func(pass string) (int, string) {
		pu := &url.URL{Scheme: "http", User: url.UserPassword("job", pass), Host: l.Addr().String()}
		cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
		resp, err := cl.Get(fmt.Sprintf("http://echo.test:%d/x", webPort))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(secret); code != 200 || body != `path=/x auth=""` {
		t.Errorf("forward: %d %q, want 200 with the proxy credentials removed", code, body)
	}
	if code, _ := get("wrong"); code != http.StatusProxyAuthRequired {
		t.Errorf("wrong secret: %d, want 407", code)
	}

	// CONNECT to the TCP echo server by name.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	auth := "Basic " + basic("job", secret)
	fmt.Fprintf(c, "CONNECT echo.test:%d HTTP/1.1\r\nHost: echo.test\r\nProxy-Authorization: %s\r\n\r\n", tcpEcho.Port(), auth)
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, " 200 ") {
		t.Fatalf("CONNECT answer %q %v", line, err)
	}
	if l2, _ := br.ReadString('\n'); l2 != "\r\n" {
		t.Fatalf("CONNECT answer headers %q", l2)
	}
	roundTrip(t, c, "through http connect")
}

func basic(u, p string) string { return b64(u + ":" + p) }

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestPipes(t *testing.T) {
	tcpEcho, udpEcho := echoServers(t)
	rc, err := net.Dial("tcp", tcpEcho.String())
	if err != nil {
		t.Fatal(err)
	}
	f, err := PipeTCP(rc, Loopback4)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "through a tcp pipe")
	c.Close()

	f, err = PipeUDP(context.Background(), testDialer, udpEcho, Loopback4)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	roundTrip(t, uc, "through a udp pipe")
}

func TestSOCKSUDPAssociateNamedPort(t *testing.T) {
	_, udpEcho := echoServers(t)
	addr, secret := startSOCKS(t)
	mine, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	other, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := appendAddr([]byte{5, CmdUDPAssoc, 0}, netip.MustParseAddrPort(mine.LocalAddr().String()))
	bnd := socksHandshake(t, c, secret, req)
	msg := append(appendAddr([]byte{0, 0, 0}, udpEcho), "hi"...)
	ask := func(u *net.UDPConn) bool {
		for attempt := 0; attempt < 3; attempt++ {
			if _, err := u.WriteToUDPAddrPort(msg, bnd); err != nil {
				t.Fatal(err)
			}
			_ = u.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, _, err := u.ReadFromUDPAddrPort(make([]byte, 100)); err == nil {
				return true
			}
		}
		return false
	}
	if ask(other) {
		t.Error("a socket other than the one the request named used the association")
	}
	if !ask(mine) {
		t.Error("the socket the request named got no answer")
	}
}
