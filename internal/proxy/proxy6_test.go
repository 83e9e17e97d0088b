// SPDX-License-Identifier: MIT

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
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

	xproxy "golang.org/x/net/proxy"
	"golang.org/x/sys/unix"
)

// dialer6 is hostDialer with IPv6: names map to address lists (in the
// order to try), ListenUDP honours v6, and every TCP destination dialed is
// recorded.
type dialer6 struct {
	names map[string][]netip.Addr

	mu     sync.Mutex
	dialed []netip.AddrPort
}

func (d *dialer6) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, dst)
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", dst.String())
}

func (d *dialer6) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "udp", dst.String())
}

func (d *dialer6) ListenUDP(ctx context.Context, f *ipfamily.Family) (net.PacketConn, error) {
	if f == ipfamily.V6 {
		return net.ListenPacket("udp6", "[::1]:0")
	}
	return net.ListenPacket("udp4", "127.0.0.1:0")
}

func (d *dialer6) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	if a, ok := d.names[name]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

func (d *dialer6) took() []netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := slices.Clone(d.dialed)
	d.dialed = nil
	return out
}

// echo6 starts TCP and UDP echo servers on ::1 (skipping the test without
// IPv6 loopback) and a TCP echo server on 127.0.0.1 only, whose port is
// closed on ::1 (to fall back from).
func echo6(t *testing.T) (tcp6, udp6, tcp4only netip.AddrPort) {
	t.Helper()
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	l4, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l4.Close() })
	for _, l := range []net.Listener{l, l4} {
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
			}
		}()
	}
	u, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := u.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = u.WriteTo(buf[:n], a)
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String()), netip.MustParseAddrPort(u.LocalAddr().String()), netip.MustParseAddrPort(l4.Addr().String())
}

func serve6(t *testing.T, d Dialer) (socksAddr, httpAddr, secret string) {
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

// TestProxiesIPv6: SOCKS5 CONNECT with an IPv6 address (ATYP 4) and with
// names of IPv6, dual-stack and dead-IPv6 hosts; HTTP CONNECT [v6]:port
// and absolute URIs with IPv6 literals; UDP ASSOCIATE to an IPv6
// destination. Dual-stack names are dialed IPv6 first and fall back to
// IPv4 when IPv6 fails.
func TestProxiesIPv6(t *testing.T) {
	tcp6, udp6, tcp4only := echo6(t)
	lo6, lo4 := netip.IPv6Loopback(), netip.MustParseAddr("127.0.0.1")
	d := &dialer6{names: map[string][]netip.Addr{
		"v6.test":    {lo6},
		"dual.test":  {lo6, lo4},
		"dead6.test": {lo6, lo4}, // tcp4only's port is closed on ::1
	}}
	socksAddr, httpAddr, secret := serve6(t, d)

	t.Run("socks", func(t *testing.T) {
		for _, tc := range []struct {
			target string
			want   []netip.AddrPort
		}{
			{tcp6.String(), []netip.AddrPort{tcp6}}, // "[::1]:port": ATYP 4
			{net.JoinHostPort("v6.test", fmt.Sprint(tcp6.Port())), []netip.AddrPort{tcp6}},
			{net.JoinHostPort("dual.test", fmt.Sprint(tcp6.Port())), []netip.AddrPort{tcp6}},
			{net.JoinHostPort("dead6.test", fmt.Sprint(tcp4only.Port())), []netip.AddrPort{netip.AddrPortFrom(lo6, tcp4only.Port()), tcp4only}},
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
	})

	t.Run("http-connect", func(t *testing.T) {
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", tcp6, tcp6, basic("job", secret))
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		if err != nil || !strings.Contains(line, " 200 ") {
			t.Fatalf("CONNECT %s: answer %q %v", tcp6, line, err)
		}
		if l2, _ := br.ReadString('\n'); l2 != "\r\n" {
			t.Fatalf("CONNECT answer headers %q", l2)
		}
		roundTrip(t, c, "through http connect to ipv6")
		if got := d.took(); !slices.Equal(got, []netip.AddrPort{tcp6}) {
			t.Errorf("CONNECT %s: dialed %v", tcp6, got)
		}
	})

	t.Run("http-forward", func(t *testing.T) {
		wl, err := net.Listen("tcp6", "[::1]:0")
		if err != nil {
			t.Fatal(err)
		}
		web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "host=%s path=%s", r.Host, r.URL.Path)
		})}
		go func() { _ = web.Serve(wl) }()
		defer web.Close()
		pu := &url.URL{Scheme: "http", User: url.UserPassword("job", secret), Host: httpAddr}
		cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 5 * time.Second}
		target := "http://" + wl.Addr().String() + "/v6"
		resp, err := cl.Get(target)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("host=%s path=/v6", wl.Addr()); resp.StatusCode != 200 || string(b) != want {
			t.Errorf("GET %s: %d %q, want 200 %q", target, resp.StatusCode, b, want)
		}
	})

	t.Run("socks-udp", func(t *testing.T) {
		c, err := net.Dial("tcp", socksAddr)
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
		hdr := appendAddr([]byte{0, 0, 0}, udp6)
		got := ""
		for attempt := 0; attempt < 5 && got == ""; attempt++ {
			if _, err := u.Write(append(hdr, "v6 datagram"...)); err != nil {
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
			if buf[3] != atypIPv6 || netip.AddrPortFrom(src.ip, src.port) != udp6 {
				t.Errorf("answer from %v (ATYP %d), want %v (ATYP 4)", src, buf[3], udp6)
			}
			got = string(r.b)
		}
		if got != "v6 datagram" {
			t.Errorf("echo %q, want %q", got, "v6 datagram")
		}
	})

	t.Run("pipes", func(t *testing.T) {
		rc, err := net.Dial("tcp6", tcp6.String())
		if err != nil {
			t.Fatal(err)
		}
		f, err := PipeTCP(rc, Loopback6)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(c.LocalAddr().String(), "[::1]:") {
			t.Errorf("IPv6 TCP pipe on %v, want IPv6 loopback", c.LocalAddr())
		}
		roundTrip(t, c, "through an ipv6 tcp pipe")
		c.Close()
		f, err = PipeUDP(context.Background(), d, udp6, Loopback6)
		if err != nil {
			t.Fatal(err)
		}
		uc, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer uc.Close()
		roundTrip(t, uc, "through an ipv6 udp pipe")

		// An IPv6 socket of the job that asked for an IPv4 peer gets an
		// IPv6 socket on IPv4-mapped loopback addresses.
		rc4, err := net.Dial("tcp4", tcp4only.String())
		if err != nil {
			t.Fatal(err)
		}
		f, err = PipeTCP(rc4, LoopbackFor(syscall.AF_INET6, tcp4only.Addr(), true))
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
		_, udp4 := echoServers(t)
		f, err = PipeUDP(context.Background(), d, udp4, Loopback4In6)
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
	})
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
