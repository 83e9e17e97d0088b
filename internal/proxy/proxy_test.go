// SPDX-License-Identifier: MIT

package proxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/proxy/proxytest"
	"github.com/airlock-vpn/airlock/test/topology"
	xproxy "golang.org/x/net/proxy"
	"golang.org/x/sys/unix"
)

// Per family (by ipfamily.Family.Index): the loopback address the tests'
// servers listen on, the name testDialer resolves to it alone, the SOCKS
// address type of its literals, and the pipe end of the family.
var (
	loopback     = [ipfamily.N]netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	echoName     = [ipfamily.N]string{"echo.test", "echo6.test"}
	atypOf       = [ipfamily.N]byte{atypIPv4, atypIPv6}
	pipeLoopback = [ipfamily.N]Loopback{Loopback4, Loopback6}
)

// forFamilies runs fn as a subtest per address family.
func forFamilies(t *testing.T, fn func(t *testing.T, f *ipfamily.Family)) {
	for _, f := range ipfamily.All {
		t.Run(f.Name, func(t *testing.T) { fn(t, f) })
	}
}

// hostDialer dials with the host's own stack; names map to address lists
// (in the order to try), ListenUDP listens on the family's loopback.
type hostDialer struct{ names map[string][]netip.Addr }

func (d hostDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", dst.String())
}

func (d hostDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "udp", dst.String())
}

func (d hostDialer) ListenUDP(ctx context.Context, f *ipfamily.Family) (net.PacketConn, error) {
	return net.ListenPacket("udp", netip.AddrPortFrom(loopback[f.Index], 0).String())
}

func (d hostDialer) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	if a, ok := d.names[name]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

// testDialer resolves echoName of each family to its loopback address,
// dual.test to both (IPv6 first).
var testDialer = hostDialer{names: map[string][]netip.Addr{
	echoName[0]: {loopback[0]},
	echoName[1]: {loopback[1]},
	"dual.test": {loopback[1], loopback[0]},
}}

// recordingDialer is a Dialer that records every TCP destination dialed.
type recordingDialer struct {
	hostDialer
	mu     sync.Mutex
	dialed []netip.AddrPort
}

func (d *recordingDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, dst)
	d.mu.Unlock()
	return d.hostDialer.DialTCP(ctx, dst)
}

// took returns the destinations dialed since its last call.
func (d *recordingDialer) took() []netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := slices.Clone(d.dialed)
	d.dialed = nil
	return out
}

// echoServers starts a TCP and a UDP echo server on the loopback address
// of f (skipping the test on a host without IPv6 loopback).
func echoServers(t *testing.T, f *ipfamily.Family) (tcp, udp netip.AddrPort) {
	return proxytest.TCPServerAt(t, loopback[f.Index], proxytest.Echo), proxytest.UDPEchoAt(t, loopback[f.Index], "")
}

// serve starts a SOCKS and an HTTP proxy on 127.0.0.1 with dialer d and
// one secret; both stop when the test ends.
func serve(t *testing.T, d Dialer) (socksAddr, httpAddr, secret string) {
	t.Helper()
	secret, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.DiscardHandler)
	s := &SOCKS{Dialer: d, Secret: secret, Logger: log}
	h := &HTTP{Dialer: d, Secret: secret, Logger: log}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = s.Serve(ctx, sl) }()
	go func() { defer wg.Done(); _ = h.Serve(ctx, hl) }()
	t.Cleanup(func() { cancel(); sl.Close(); hl.Close(); wg.Wait() })
	return sl.Addr().String(), hl.Addr().String(), secret
}

// startSOCKS starts a SOCKS proxy with testDialer.
func startSOCKS(t *testing.T) (addr string, secret string) {
	addr, _, secret = serve(t, testDialer)
	return addr, secret
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

// TestSOCKSConnect: SOCKS5 CONNECT, per family, to an address literal
// (IPv6: ATYP 4) and to a name of the family alone, each dialing that
// address and nothing else; unknown names, a wrong secret and a refused
// port fail.
func TestSOCKSConnect(t *testing.T) {
	forFamilies(t, func(t *testing.T, f *ipfamily.Family) {
		tcpEcho, _ := echoServers(t, f)
		d := &recordingDialer{hostDialer: testDialer}
		addr, _, secret := serve(t, d)
		for _, tc := range []struct {
			name, target string
			pass         string
			ok           bool
		}{
			{"ip", tcpEcho.String(), secret, true},
			{"remote-dns", net.JoinHostPort(echoName[f.Index], fmt.Sprint(tcpEcho.Port())), secret, true},
			{"unknown-name", "nx.test:80", secret, false},
			{"wrong-secret", tcpEcho.String(), "x" + secret, false},
			{"refused", netip.AddrPortFrom(loopback[f.Index], 1).String(), secret, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				sd, err := xproxy.SOCKS5("tcp", addr, &xproxy.Auth{User: "job", Password: tc.pass}, xproxy.Direct)
				if err != nil {
					t.Fatal(err)
				}
				d.took()
				c, err := sd.Dial("tcp", tc.target)
				if (err == nil) != tc.ok {
					t.Fatalf("dial %s: err %v, want ok=%v", tc.target, err, tc.ok)
				}
				if err == nil {
					defer c.Close()
					roundTrip(t, c, "hello through socks")
					if got := d.took(); !slices.Equal(got, []netip.AddrPort{tcpEcho}) {
						t.Errorf("socks %s: dialed %v, want %v", tc.target, got, tcpEcho)
					}
				}
			})
		}
	})
}

// TestSOCKSConnectDualStackName: a name with both families' addresses is
// dialed IPv6 first, and IPv4 when IPv6 fails (its port closed on ::1).
func TestSOCKSConnectDualStackName(t *testing.T) {
	tcp6, _ := echoServers(t, ipfamily.V6)
	tcp4only, _ := echoServers(t, ipfamily.V4) // its port is closed on ::1
	d := &recordingDialer{hostDialer: testDialer}
	socksAddr, _, secret := serve(t, d)
	for _, tc := range []struct {
		target string
		want   []netip.AddrPort
	}{
		{net.JoinHostPort("dual.test", fmt.Sprint(tcp6.Port())), []netip.AddrPort{tcp6}},
		{net.JoinHostPort("dual.test", fmt.Sprint(tcp4only.Port())), []netip.AddrPort{netip.AddrPortFrom(loopback[1], tcp4only.Port()), tcp4only}},
	} {
		sd, err := xproxy.SOCKS5("tcp", socksAddr, &xproxy.Auth{User: "job", Password: secret}, xproxy.Direct)
		if err != nil {
			t.Fatal(err)
		}
		c, err := sd.Dial("tcp", tc.target)
		if err != nil {
			t.Errorf("socks dial %s: %v", tc.target, err)
			continue
		}
		roundTrip(t, c, "socks to "+tc.target)
		c.Close()
		if got := d.took(); !slices.Equal(got, tc.want) {
			t.Errorf("socks %s: dialed %v, want %v", tc.target, got, tc.want)
		}
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

// TestSOCKSUDPAssociate: per family, datagrams through a UDP association
// to an address literal and to a name of the family reach the echo
// server, and its answers come back from its address, with the family's
// address type.
func TestSOCKSUDPAssociate(t *testing.T) {
	forFamilies(t, func(t *testing.T, f *ipfamily.Family) {
		_, udpEcho := echoServers(t, f)
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
				name := echoName[f.Index]
				hdr = append(hdr, atypDomain, byte(len(name)))
				hdr = append(hdr, name...)
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
				if buf[3] != atypOf[f.Index] || netip.AddrPortFrom(src.ip, src.port) != udpEcho {
					t.Errorf("answer from %v (ATYP %d), want %v (ATYP %d)", src, buf[3], udpEcho, atypOf[f.Index])
				}
				got = string(r.b)
			}
			if got != payload {
				t.Errorf("echo %q, want %q", got, payload)
			}
		}
	})
}

func TestSOCKSUDPRelay(t *testing.T) {
	_, udpEcho := echoServers(t, ipfamily.V4)
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
	// The relay's socket is closed (its port can be bound again) ...
	if !topology.Poll(5*time.Second, func() bool {
		l, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(bnd))
		if err == nil {
			l.Close()
		}
		return err == nil
	}) {
		t.Error("the relay's socket still open 5 s after its control connection closed")
	}
	// ... and nothing answers there.
	_, _ = u.WriteToUDPAddrPort([]byte("after close"), bnd)
	_ = u.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, _, err := u.ReadFromUDPAddrPort(make([]byte, 100)); err == nil {
		t.Error("relay still answers after its control connection closed")
	}
}

// TestHTTPProxy: per family, the HTTP proxy forwards requests for a name
// of the family and for an address literal (the proxy credentials
// removed), refuses a wrong secret with 407, and CONNECTs to a name and to
// a literal ([v6]:port), dialing only that address.
func TestHTTPProxy(t *testing.T) {
	forFamilies(t, func(t *testing.T, f *ipfamily.Family) {
		tcpEcho, _ := echoServers(t, f)
		web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "host=%s path=%s auth=%q", r.Host, r.URL.Path, r.Header.Get("Proxy-Authorization"))
		})}
		wl, err := net.Listen("tcp", netip.AddrPortFrom(loopback[f.Index], 0).String())
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = web.Serve(wl) }()
		t.Cleanup(func() { web.Close() })
		webPort := netip.MustParseAddrPort(wl.Addr().String()).Port()
		d := &recordingDialer{hostDialer: testDialer}
		_, httpAddr, secret := serve(t, d)

		get := func(pass, host string) (int, string) {
			pu := &url.URL{Scheme: "http", User: url.UserPassword("job", pass), Host: httpAddr}
			cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
			resp, err := cl.Get(fmt.Sprintf("http://%s/x", host))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		byName := net.JoinHostPort(echoName[f.Index], fmt.Sprint(webPort))
		for _, host := range []string{byName, wl.Addr().String()} {
			if code, body := get(secret, host); code != 200 || body != fmt.Sprintf(`host=%s path=/x auth=""`, host) {
				t.Errorf("forward to %s: %d %q, want 200 with the proxy credentials removed", host, code, body)
			}
		}
		if code, _ := get("wrong", byName); code != http.StatusProxyAuthRequired {
			t.Errorf("wrong secret: %d, want 407", code)
		}

		// CONNECT to the TCP echo server by name and by address.
		for _, target := range []string{net.JoinHostPort(echoName[f.Index], fmt.Sprint(tcpEcho.Port())), tcpEcho.String()} {
			c, err := net.Dial("tcp", httpAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			d.took()
			auth := "Basic " + basic("job", secret)
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", target, target, auth)
			br := bufio.NewReader(c)
			line, err := br.ReadString('\n')
			if err != nil || !strings.Contains(line, " 200 ") {
				t.Fatalf("CONNECT %s: answer %q %v", target, line, err)
			}
			if l2, _ := br.ReadString('\n'); l2 != "\r\n" {
				t.Fatalf("CONNECT answer headers %q", l2)
			}
			roundTrip(t, c, "through http connect")
			if got := d.took(); !slices.Equal(got, []netip.AddrPort{tcpEcho}) {
				t.Errorf("CONNECT %s: dialed %v, want %v", target, got, tcpEcho)
			}
		}
	})
}

func basic(u, p string) string { return b64(u + ":" + p) }

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestPipes: per family, a TCP and a UDP pipe to an echo server carry
// data both ways, the job's end on the family's loopback address.
func TestPipes(t *testing.T) {
	forFamilies(t, func(t *testing.T, f *ipfamily.Family) {
		tcpEcho, udpEcho := echoServers(t, f)
		rc, err := net.Dial("tcp", tcpEcho.String())
		if err != nil {
			t.Fatal(err)
		}
		p, err := PipeTCP(rc, pipeLoopback[f.Index])
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.FileConn(p)
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		if a := netip.MustParseAddrPort(c.LocalAddr().String()).Addr(); a != loopback[f.Index] {
			t.Errorf("TCP pipe on %v, want %v", c.LocalAddr(), loopback[f.Index])
		}
		roundTrip(t, c, "through a tcp pipe")
		c.Close()

		p, err = PipeUDP(context.Background(), testDialer, udpEcho, pipeLoopback[f.Index])
		if err != nil {
			t.Fatal(err)
		}
		uc, err := net.FileConn(p)
		p.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer uc.Close()
		roundTrip(t, uc, "through a udp pipe")
	})
}

// TestPipesIPv4MappedForIPv6Socket: an IPv6 socket of the job that asked
// for an IPv4 peer gets an IPv6 socket on IPv4-mapped loopback addresses,
// TCP and UDP.
func TestPipesIPv4MappedForIPv6Socket(t *testing.T) {
	tcp4, udp4 := echoServers(t, ipfamily.V4)
	rc4, err := net.Dial("tcp4", tcp4.String())
	if err != nil {
		t.Fatal(err)
	}
	f, err := PipeTCP(rc4, LoopbackFor(syscall.AF_INET6, tcp4.Addr(), true))
	if err != nil {
		t.Fatal(err)
	}
	if l, p := mappedEnds(t, f); !l || !p {
		t.Errorf("4-in-6 TCP pipe: own address IPv4-mapped %v, peer %v; want both", l, p)
	}
	c4, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c4, "through a 4-in-6 tcp pipe")
	c4.Close()
	f, err = PipeUDP(context.Background(), testDialer, udp4, Loopback4In6)
	if err != nil {
		t.Fatal(err)
	}
	if l, p := mappedEnds(t, f); !l || !p {
		t.Errorf("4-in-6 UDP pipe: own address IPv4-mapped %v, peer %v; want both", l, p)
	}
	u4, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer u4.Close()
	roundTrip(t, u4, "through a 4-in-6 udp pipe")
}

// mappedEnds reports whether the socket f is AF_INET6 with an IPv4-mapped
// address at its own end and at its peer's (as the kernel says: Go's net
// package would show them unmapped).
func mappedEnds(t *testing.T, f *os.File) (local, peer bool) {
	t.Helper()
	is := func(sa unix.Sockaddr, err error) bool {
		s6, ok := sa.(*unix.SockaddrInet6)
		return err == nil && ok && netip.AddrFrom16(s6.Addr).Is4In6()
	}
	return is(unix.Getsockname(int(f.Fd()))), is(unix.Getpeername(int(f.Fd())))
}

func TestSOCKSUDPAssociateNamedPort(t *testing.T) {
	_, udpEcho := echoServers(t, ipfamily.V4)
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
