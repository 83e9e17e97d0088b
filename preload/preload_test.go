// SPDX-License-Identifier: MIT

// Package preload_test builds the LD_PRELOAD library with the project's
// warning flags and runs real programs (python3, sh) under it against an
// in-process SOCKS proxy whose "tunnel" leads to local servers. The
// end-to-end tests (test/e2e) run it on the real topology.
package preload_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/proxy"
	"github.com/airlock-vpn/airlock/internal/proxy/proxytest"
)

const staticEnv = "PRELOAD_TEST_GO_DIAL"

func TestMain(m *testing.M) {
	if addr := os.Getenv(staticEnv); addr != "" {
		// A Go program: it makes its system calls itself, not through
		// libc, like a statically linked binary.
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			fmt.Println("go dial failed:", err)
			os.Exit(1)
		}
		c.Close()
		fmt.Println("go dial connected")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// buildLib compiles the library with -Werror on top of the Makefile's
// warning flags.
func buildLib(t *testing.T, flags ...string) string {
	t.Helper()
	if flags == nil {
		flags = []string{"-O2", "-Wl,-z,defs"}
	}
	out := filepath.Join(t.TempDir(), "libairlock-preload.so")
	srcs, _ := filepath.Glob("src/*.c")
	args := append(append([]string{"-std=gnu11", "-Wall", "-Wextra", "-pedantic", "-Werror"}, flags...), "-fPIC", "-shared", "-o", out)
	args = append(append(args, srcs...), "-ldl", "-lpthread")
	if b, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out
}

// serveSOCKS runs the library's SOCKS5 proxy on loopback, leading to o,
// on 127.0.0.1 and on ::1 (for IPv6-only sockets); it returns both
// addresses and the proxy's secret.
func serveSOCKS(t *testing.T, o *outside) (addr, addr6, secret string) {
	t.Helper()
	secret, err := proxy.NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatalf("no IPv6 loopback: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &proxy.SOCKS{Dialer: o, Secret: secret, Logger: slog.New(slog.DiscardHandler)}
	done := make(chan struct{}, 2)
	go func() { defer func() { done <- struct{}{} }(); _ = s.Serve(ctx, l) }()
	go func() { defer func() { done <- struct{}{} }(); _ = s.Serve(ctx, l6) }()
	t.Cleanup(func() { cancel(); l.Close(); l6.Close(); <-done; <-done })
	return l.Addr().String(), l6.Addr().String(), secret
}

// outside is what the fake tunnel leads to: every TCP destination reaches
// the greeter (port 53: the DNS server), every UDP destination the echo
// server.
type outside struct {
	greeter, dnsTCP, echo netip.AddrPort
	greeted               atomic.Int32

	mu     sync.Mutex
	dialed []string // "tcp DST" and "udp DST" as the proxy asked, port 53 left out
}

func (o *outside) record(proto string, dst netip.AddrPort) {
	if dst.Port() == 53 {
		return
	}
	o.mu.Lock()
	o.dialed = append(o.dialed, proto+" "+dst.String())
	o.mu.Unlock()
}

// took returns and forgets the destinations dialed so far.
func (o *outside) took() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	d := o.dialed
	o.dialed = nil
	return d
}

func (o *outside) DialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	o.record("tcp", dst)
	to := o.greeter
	if dst.Port() == 53 {
		to = o.dnsTCP
	}
	return (&net.Dialer{}).DialContext(ctx, "tcp", to.String())
}

func (o *outside) DialUDP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	o.record("udp", dst)
	return (&net.Dialer{}).DialContext(ctx, "udp", o.echo.String())
}

func (o *outside) ListenUDP(ctx context.Context, _ *ipfamily.Family) (net.PacketConn, error) {
	return net.ListenPacket("udp", "127.0.0.1:0")
}

func (o *outside) LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	return nil, &net.DNSError{Err: "not used", Name: name}
}

func startOutside(t *testing.T) *outside {
	o := &outside{}
	o.greeter = proxytest.TCPServer(t, func(c net.Conn) {
		o.greeted.Add(1)
		_, _ = c.Write([]byte("hello from outside"))
	})
	o.echo = proxytest.UDPEcho(t, "echo ")

	dl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{Listener: dl, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case q.Name == "files.test." && q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "real.files.test."},
				&dns.A{Hdr: dns.RR_Header{Name: "real.files.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 10)})
		case q.Name == "dual.test." && q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 11)})
		case (q.Name == "dual.test." || q.Name == "v6only.test.") && q.Qtype == dns.TypeAAAA:
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 60}, AAAA: net.ParseIP("2001:db8::11")})
		case q.Name == "files.test.", q.Name == "dual.test.", q.Name == "v6only.test.":
		default:
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	o.dnsTCP = netip.MustParseAddrPort(dl.Addr().String())
	return o
}

const script = `
import socket
ai = socket.getaddrinfo("files.test", 80, socket.AF_INET, socket.SOCK_STREAM)
ip = ai[0][4][0]
print("resolved", ip)
print("byname", socket.gethostbyname("files.test"))
s = socket.create_connection((ip, 80), timeout=5)
print("tcp", s.recv(100).decode())
s6 = socket.create_connection(("::ffff:" + ip, 80), timeout=5)
print("tcp6", s6.recv(100).decode())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
u.sendto(b"ping", (ip, 7))
d, a = u.recvfrom(100)
print("udp", d.decode(), a[0], a[1])
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.settimeout(5)
c.connect((ip, 9))
c.send(b"conn")
print("udpc", c.recv(100).decode())
try:
    socket.getaddrinfo("nx.test", 80)
    print("nx resolved")
except socket.gaierror as e:
    print("nx", e.errno == socket.EAI_NONAME)
print("localhost", socket.gethostbyname("localhost"))
`

// script6 resolves names of both families and, with argv[1] "dual-stack",
// talks to an IPv6 destination over TCP and UDP from AF_INET6 sockets.
const script6 = `
import socket, sys
def addrs(name, fam, flags=0):
    try:
        return [a[4][0] for a in socket.getaddrinfo(name, 80, fam, socket.SOCK_STREAM, 0, flags)]
    except socket.gaierror:
        return []
print("dual", addrs("dual.test", socket.AF_UNSPEC))
print("v6only", addrs("v6only.test", socket.AF_UNSPEC))
print("v6", addrs("dual.test", socket.AF_INET6))
print("mapped", addrs("dual.test", socket.AF_INET6, socket.AI_V4MAPPED))
if sys.argv[1].startswith("dual-stack"):
    s = socket.create_connection(("2001:db8::11", 80), timeout=5)
    print("tcp6", s.recv(100).decode())
    u = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(b"ping6", ("2001:db8::11", 7))
    d, a = u.recvfrom(100)
    print("udp6", d.decode(), a[0], a[1])
    c = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    c.settimeout(5)
    c.connect(("2001:db8::11", 9))
    c.send(b"conn6")
    print("udp6c", c.recv(100).decode())
    # Sockets that cannot use IPv4-mapped addresses go to the proxy's
    # IPv6 loopback listener (AIRLOCK_SOCKS's IPv6 entry, or the
    # deprecated AIRLOCK_SOCKS6) and relays on ::1.
    o = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    o.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    o.settimeout(5)
    o.connect(("2001:db8::11", 80))
    print("tcp6only", o.recv(100).decode())
    v = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    v.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    v.settimeout(5)
    v.sendto(b"ping6only", ("2001:db8::11", 7))
    d, a = v.recvfrom(100)
    print("udp6only", d.decode(), a[0], a[1])
`

func TestPreload(t *testing.T) {
	lib := buildLib(t)
	o := startOutside(t)
	socks, socks6, secret := serveSOCKS(t, o)

	dir := t.TempDir()
	py := filepath.Join(dir, "job.py")
	if err := os.WriteFile(py, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "LD_PRELOAD="+lib, "AIRLOCK_SOCKS="+socks,
		"AIRLOCK_SOCKS_SECRET="+secret, "AIRLOCK_DNS=192.0.2.53")
	run := func(t *testing.T, env []string, name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	want := []string{"resolved 192.0.2.10", "byname 192.0.2.10", "tcp hello from outside", "tcp6 hello from outside",
		"udp echo ping 192.0.2.10 7", "udpc echo conn", "nx True", "localhost 127.0.0.1"}

	t.Run("python", func(t *testing.T) {
		out, err := run(t, env, "/usr/bin/python3", py)
		if err != nil {
			t.Fatalf("python3: %v\n%s", err, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("output lacks %q:\n%s", w, out)
			}
		}
	})
	t.Run("ipv6", func(t *testing.T) {
		env6 := append(append([]string{}, env...), "AIRLOCK_IPV6=1", "AIRLOCK_SOCKS6="+socks6)
		envList := append(append([]string{}, env...), "AIRLOCK_IPV6=1", "AIRLOCK_SOCKS="+socks+","+socks6)
		for _, tc := range []struct {
			name string
			env  []string
			want []string
		}{
			// The one form: AIRLOCK_SOCKS lists the proxy's addresses of
			// both families.
			{"dual-stack-list", envList, []string{"dual ['2001:db8::11', '192.0.2.11']", "v6only ['2001:db8::11']",
				"tcp6 hello from outside", "udp6c echo conn6", "tcp6only hello from outside", "udp6only echo ping6only 2001:db8::11 7"}},
			// The tunnel carries IPv6: AAAA first, IPv6-only names work,
			// and IPv6 connects and datagrams reach the proxy as IPv6
			// (here through the deprecated alias AIRLOCK_SOCKS6).
			{"dual-stack", env6, []string{"dual ['2001:db8::11', '192.0.2.11']", "v6only ['2001:db8::11']",
				"v6 ['2001:db8::11']", "mapped ['2001:db8::11']",
				"tcp6 hello from outside", "udp6 echo ping6 2001:db8::11 7", "udp6c echo conn6",
				"tcp6only hello from outside", "udp6only echo ping6only 2001:db8::11 7"}},
			// IPv4 only: A records only, and AF_INET6 with AI_V4MAPPED
			// gets them mapped.
			{"ipv4-only", env, []string{"dual ['192.0.2.11']", "v6only []", "v6 ['2001:db8::11']", "mapped ['::ffff:192.0.2.11']"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				o.took()
				out, err := run(t, tc.env, "/usr/bin/python3", "-c", script6, tc.name)
				if err != nil {
					t.Fatalf("python3: %v\n%s", err, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(out, w) {
						t.Errorf("output lacks %q:\n%s", w, out)
					}
				}
				if tc.name == "dual-stack" {
					got := strings.Join(o.took(), ", ")
					for _, w := range []string{"tcp [2001:db8::11]:80", "udp [2001:db8::11]:7", "udp [2001:db8::11]:9"} {
						if !strings.Contains(got, w) {
							t.Errorf("the proxy was asked for %s; want %s among them", got, w)
						}
					}
				}
			})
		}
	})
	t.Run("shell-children", func(t *testing.T) {
		out, err := run(t, env, "sh", "-c", "/usr/bin/python3 "+py+" && sh -c '/usr/bin/python3 "+py+"'")
		if err != nil {
			t.Fatalf("sh: %v\n%s", err, out)
		}
		if n := strings.Count(out, "tcp hello from outside"); n != 2 {
			t.Errorf("%d of 2 children connected through the proxy:\n%s", n, out)
		}
	})
	t.Run("wrong-secret", func(t *testing.T) {
		bad := append(append([]string{}, env...), "AIRLOCK_SOCKS_SECRET=0000")
		out, err := run(t, bad, "/usr/bin/python3", "-c", "import socket; socket.create_connection(('192.0.2.10', 80), timeout=5)")
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("connect with a wrong secret: %v, %q; want EACCES", err, out)
		}
	})
	t.Run("go-binary-not-covered", func(t *testing.T) {
		before := o.greeted.Load()
		self, _ := os.Executable()
		out, err := run(t, append(env, staticEnv+"=192.0.2.10:80"), self)
		if err == nil || o.greeted.Load() != before {
			t.Errorf("a Go program's connect went through the preload library (%v, %q); it makes its own system calls", err, out)
		}
	})
	t.Run("inactive-without-config", func(t *testing.T) {
		out, err := run(t, append(os.Environ(), "LD_PRELOAD="+lib), "/usr/bin/python3", "-c", "import socket; print(socket.gethostbyname('localhost'))")
		if err != nil || strings.TrimSpace(out) != "127.0.0.1" {
			t.Errorf("without AIRLOCK_* the library must stay out of the way: %v %q", err, out)
		}
	})
}
