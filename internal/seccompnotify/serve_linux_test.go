// SPDX-License-Identifier: MIT

package seccompnotify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/proxy"
	"github.com/airlock-vpn/airlock/internal/proxy/proxytest"
)

const jobEnv = "SECCOMPNOTIFY_TEST_JOB"

func TestMain(m *testing.M) {
	Init()
	if v := os.Getenv(jobEnv); v != "" {
		os.Exit(testJob(v))
	}
	os.Exit(m.Run())
}

// testJob is the job the tests run under the filter: "tcp ADDR" reads what
// ADDR sends, "udp ADDR" sends one datagram and prints the answer.
func testJob(spec string) int {
	proto, addr, _ := strings.Cut(spec, " ")
	if proto == "mapped" {
		return testMapped(addr)
	}
	if proto == "udp4on6" {
		return testUDP4On6(addr)
	}
	c, err := net.DialTimeout(proto, addr, 5*time.Second)
	if err != nil {
		fmt.Println("dial error:", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if proto == "udp" {
		if _, err := c.Write([]byte("ping")); err != nil {
			fmt.Println("write error:", err)
			return 1
		}
	}
	b := make([]byte, 100)
	n, err := c.Read(b)
	if err != nil && err != io.EOF {
		fmt.Println("read error:", err)
		return 1
	}
	fmt.Printf("%s %s: %s\n", proto, c.RemoteAddr().Network(), b[:n])
	return 0
}

// testMapped connects an AF_INET6 TCP socket to the IPv4-mapped form of
// the IPv4 address addr (what a dual-stack program does for IPv4 peers)
// and prints what it reads and the family of the peer it is connected to.
func testMapped(addr string) int {
	ap := netip.MustParseAddrPort(addr)
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Println("socket error:", err)
		return 1
	}
	defer unix.Close(fd)
	mapped := netip.AddrFrom16(ap.Addr().As16())
	if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: mapped.As16(), Port: int(ap.Port())}); err != nil {
		fmt.Println("dial error:", err)
		return 1
	}
	tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	b := make([]byte, 100)
	n, err := unix.Read(fd, b)
	if err != nil || n < 0 {
		fmt.Println("read error:", err)
		return 1
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		fmt.Println("getpeername error:", err)
		return 1
	}
	p6, six := peer.(*unix.SockaddrInet6)
	fmt.Printf("mapped v6=%v v4mapped=%v: %s\n", six, six && netip.AddrFrom16(p6.Addr).Is4In6(), b[:n])
	return 0
}

// testUDP4On6 does what glibc's getaddrinfo does to sort addresses: it
// connects an AF_INET6 UDP socket with an AF_INET sockaddr (the IPv4 peer
// addr) and asks for the socket's own address, which must be IPv4-mapped
// (glibc asserts it); then it sends one datagram and prints the answer.
func testUDP4On6(addr string) int {
	ap := netip.MustParseAddrPort(addr)
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Println("socket error:", err)
		return 1
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}); err != nil {
		fmt.Println("dial error:", err)
		return 1
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		fmt.Println("getsockname error:", err)
		return 1
	}
	s6, six := sa.(*unix.SockaddrInet6)
	if _, err := unix.Write(fd, []byte("ping")); err != nil {
		fmt.Println("write error:", err)
		return 1
	}
	tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	b := make([]byte, 100)
	n, err := unix.Read(fd, b)
	if err != nil || n < 0 {
		fmt.Println("read error:", err)
		return 1
	}
	fmt.Printf("udp4on6 v4mapped=%v: %s\n", six && netip.AddrFrom16(s6.Addr).Is4In6(), b[:n])
	return 0
}

// testRedirector sends redirected connections to fixed local servers.
type testRedirector struct {
	tcp, udp netip.AddrPort // where "outside" connections really go
	seen     chan Connect
}

// hostDialer dials with the host stack.
type hostDialer struct{}

func (hostDialer) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "tcp", dst.String())
}
func (hostDialer) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "udp", dst.String())
}
func (hostDialer) ListenUDP(ctx context.Context, _ *ipfamily.Family) (net.PacketConn, error) {
	return net.ListenPacket("udp", "127.0.0.1:0")
}
func (hostDialer) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "no DNS in this test", Name: name}
}

func (r *testRedirector) Redirect(ctx context.Context, c Connect) (*os.File, error) {
	select {
	case r.seen <- c:
	default:
	}
	if c.Dst.Addr().IsLoopback() {
		return nil, nil
	}
	if c.Dst.Port() == 1 {
		return nil, syscall.ECONNREFUSED
	}
	switch c.Type {
	case syscall.SOCK_STREAM:
		rc, err := hostDialer{}.DialTCP(ctx, r.tcp)
		if err != nil {
			return nil, err
		}
		return proxy.PipeTCP(rc, proxy.LoopbackFor(c.Family, c.Dst.Addr(), true))
	case syscall.SOCK_DGRAM:
		return proxy.PipeUDP(ctx, hostDialer{}, r.udp, proxy.LoopbackFor(c.Family, c.Dst.Addr(), true))
	}
	return nil, nil
}

func servers(t *testing.T) (netip.AddrPort, netip.AddrPort) {
	return proxytest.TCPServer(t, proxytest.Greet("hello from tcp")), proxytest.UDPEcho(t, "echo ")
}

// runJob runs the test binary as a job under the filter with the given
// command (argv after the shim) and job spec.
func runJob(t *testing.T, r Redirector, spec string, argv ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), jobEnv+"="+spec)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	l, err := Start(cmd, nil)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, slog.New(slog.DiscardHandler), l, r) }()
	werr := cmd.Wait()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Serve did not return after the job exited")
	}
	return out.String(), werr
}

func TestRedirect(t *testing.T) {
	tcpSrv, udpSrv := servers(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	v6 := true
	if l, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		v6 = false
	} else {
		l.Close()
	}
	for _, tc := range []struct {
		name, spec string
		argv       []string
		want       string
		ok         bool
		dst        string // the destination the redirector must see, if set
		family     int    // the socket family it must see, if set
	}{
		// 192.0.2.0/24 (TEST-NET-1) is not routed: only the redirect
		// can make these connects succeed.
		{"tcp", "tcp 192.0.2.10:80", []string{self}, "tcp tcp: hello from tcp", true, "", 0},
		{"udp", "udp 192.0.2.10:53", []string{self}, "udp udp: echo ping", true, "", 0},
		{"refused", "tcp 192.0.2.10:1", []string{self}, "connection refused", false, "", 0},
		{"loopback-untouched", "tcp " + tcpSrv.String(), []string{self}, "hello from tcp", true, "", 0},
		// A shell and its children inherit the filter.
		{"children", "tcp 192.0.2.10:80", []string{"sh", "-c", self + " && " + self}, "tcp tcp: hello from tcp\ntcp tcp: hello from tcp", true, "", 0},
		// IPv6 (2001:db8::/32 is not routed either): sockaddr_in6 is
		// caught, and the job's AF_INET6 socket gets an IPv6 loopback
		// replacement.
		{"tcp6", "tcp [2001:db8::10]:80", []string{self}, "tcp tcp: hello from tcp", true, "[2001:db8::10]:80", syscall.AF_INET6},
		{"udp6", "udp [2001:db8::10]:53", []string{self}, "udp udp: echo ping", true, "[2001:db8::10]:53", syscall.AF_INET6},
		// An IPv4-mapped address on an AF_INET6 socket is seen as the
		// IPv4 address it maps.
		{"v4-mapped", "mapped 192.0.2.10:80", []string{self}, "mapped v6=true v4mapped=true: hello from tcp", true, "192.0.2.10:80", syscall.AF_INET6},
		// An AF_INET sockaddr on an AF_INET6 UDP socket (glibc's
		// getaddrinfo does it): the replacement's own address is
		// IPv4-mapped, as the kernel's would be.
		{"udp-v4-on-v6-socket", "udp4on6 192.0.2.10:53", []string{self}, "udp4on6 v4mapped=true: echo ping", true, "192.0.2.10:53", syscall.AF_INET6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.family == syscall.AF_INET6 && !v6 {
				t.Skip("no IPv6 loopback")
			}
			r := &testRedirector{tcp: tcpSrv, udp: udpSrv, seen: make(chan Connect, 8)}
			out, err := runJob(t, r, tc.spec, tc.argv...)
			if (err == nil) != tc.ok || !strings.Contains(out, tc.want) {
				t.Fatalf("job: err %v, output %q; want ok=%v and %q", err, out, tc.ok, tc.want)
			}
			select {
			case c := <-r.seen:
				if c.Pid <= 0 || c.FD < 0 || (c.Family != syscall.AF_INET && c.Family != syscall.AF_INET6) {
					t.Errorf("connect seen as %+v", c)
				}
				if tc.dst != "" && (c.Dst.String() != tc.dst || c.Family != tc.family) {
					t.Errorf("connect seen to %v (family %d), want %s (family %d)", c.Dst, c.Family, tc.dst, tc.family)
				}
			default:
				t.Error("the redirector saw no connect")
			}
		})
	}
}

func TestStartNotFound(t *testing.T) {
	cmd := exec.Command("/nonexistent/airlock-no-such-command")
	var out bytes.Buffer
	cmd.Stderr = &out
	l, err := Start(cmd, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 127 {
		t.Fatalf("exit %v, want 127; stderr %q", err, out.String())
	}
}
