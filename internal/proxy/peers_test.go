// SPDX-License-Identifier: MIT

package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/test/topology"
)

// nobody is the uid and gid of the "other user of the node" in these
// tests.
const nobody = 65534

// asNobody starts python3 -c script ARGS as uid nobody and returns the
// command; its stdout is in the returned buffer once it exited.
func asNobody(t *testing.T, script string, args ...string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", script}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, &out
}

// firstLine waits up to 5 s for the first line of out (a port the
// script prints once it listens) and returns it, or "".
func firstLine(out *strings.Builder) string {
	var line string
	topology.Poll(5*time.Second, func() bool {
		var ok bool
		line, _, ok = strings.Cut(out.String(), "\n")
		return ok
	})
	return line
}

// sendAsNobody sends one SOCKS5 UDP datagram to echo through the relay at
// bnd from a socket of another user, and reports what came back within a
// second.
const sendAsNobody = `
import socket, sys
bnd, port, echo, eport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
hdr = bytes([0, 0, 0, 1]) + socket.inet_aton(echo) + eport.to_bytes(2, "big")
s.sendto(hdr + b"from the neighbour", (bnd, port))
try:
    d, a = s.recvfrom(4096)
    print("got", d)
except socket.timeout:
    print("nothing")
`

// TestSOCKSUDPAssociateOtherUser: another user of the node sends the first
// datagram to a job's UDP association (which, naming no port, used to be
// claimed by whoever sent first from 127.0.0.1). It must get nothing
// through, and the job's own datagrams must still work.
func TestSOCKSUDPAssociateOtherUser(t *testing.T) {
	_, udpEcho := echoServers(t, ipfamily.V4)
	addr, secret := startSOCKS(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bnd := socksHandshake(t, c, secret, []byte{5, CmdUDPAssoc, 0, atypIPv4, 0, 0, 0, 0, 0, 0})
	_ = c.SetDeadline(time.Time{})

	cmd, out := asNobody(t, sendAsNobody, bnd.Addr().String(), fmt.Sprint(bnd.Port()), udpEcho.Addr().String(), fmt.Sprint(udpEcho.Port()))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("neighbour: %v %s", err, out)
	}
	if strings.TrimSpace(out.String()) != "nothing" {
		t.Errorf("another user's datagram went through the job's association: %s", out)
	}

	u, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(bnd))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	msg := append(appendUDPHeader(nil, udpEcho), "from the job"...)
	buf := make([]byte, 2048)
	for try := 0; ; try++ {
		u.Write(msg)
		u.SetReadDeadline(time.Now().Add(time.Second))
		n, err := u.Read(buf)
		if err == nil {
			if !strings.HasSuffix(string(buf[:n]), "from the job") {
				t.Fatalf("job got %q", buf[:n])
			}
			break
		}
		if try == 4 {
			t.Fatalf("the job's own datagrams get no answer after another user tried its association: %v", err)
		}
	}
}

// TestProxiesRefuseOtherUser: a connection from another user's socket to
// the SOCKS or HTTP proxy is closed before a byte of the protocol (even
// with the secret, which another user may have learnt).
func TestProxiesRefuseOtherUser(t *testing.T) {
	socksAddr, secret := startSOCKS(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &HTTP{Dialer: testDialer, Secret: secret, Logger: discard}
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); l.Close(); <-done })

	const probe = `
import socket, sys
host, port, msg = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
c = socket.create_connection((host, port), timeout=2)
c.settimeout(2)
c.sendall(msg)
try:
    print("got", c.recv(100))
except (socket.timeout, ConnectionResetError) as e:
    print("nothing", type(e).__name__)
`
	hello := append([]byte{5, 1, 2, 1, 3, 'j', 'o', 'b', byte(len(secret))}, secret...)
	get := "GET http://192.0.2.1/ HTTP/1.1\r\nHost: 192.0.2.1\r\nProxy-Authorization: Basic " + basic("job", secret) + "\r\n\r\n"
	for _, tc := range []struct{ name, addr, msg string }{
		{"socks", socksAddr, fmt.Sprintf("%x", hello)},
		{"http", l.Addr().String(), fmt.Sprintf("%x", get)},
	} {
		ap := netip.MustParseAddrPort(tc.addr)
		cmd, out := asNobody(t, probe, ap.Addr().String(), fmt.Sprint(ap.Port()), tc.msg)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%s: neighbour: %v %s", tc.name, err, out)
		}
		if got := strings.TrimSpace(out.String()); got != "got b''" && !strings.HasPrefix(got, "nothing") {
			t.Errorf("%s: another user's connection was served: %s", tc.name, got)
		}
	}
}

// TestDialOwned: an exposed port's loopback target is reached only if the
// job's uid listens there.
func TestDialOwned(t *testing.T) {
	const listen = `
import socket, sys, time
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen(5)
print(l.getsockname()[1], flush=True)
l.settimeout(1)
try:
    c, a = l.accept()
    print("accepted", flush=True)
except socket.timeout:
    print("no connection", flush=True)
`
	cmd, out := asNobody(t, listen)
	port := firstLine(out)
	theirs := netip.MustParseAddrPort("127.0.0.1:" + strings.TrimSpace(port))
	c, err := DialOwned(context.Background(), nil, theirs)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, ErrForeignPeer) {
		t.Errorf("DialOwned to another user's listener: %v, want ErrForeignPeer", err)
	}
	cmd.Wait()
	if !strings.Contains(out.String(), "no connection") {
		t.Errorf("another user's service saw a connection: %q", out)
	}

	mine, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	c, err = DialOwned(context.Background(), nil, netip.MustParseAddrPort(mine.Addr().String()))
	if err != nil {
		t.Fatalf("DialOwned to our own listener: %v", err)
	}
	c.Close()
}

// TestSOCKSUDPRelayForeignSource: the preload library's relay command
// names the job's UDP socket as the relay's only source; a socket of
// another user is refused (the job must not aim a relay at a neighbour's
// socket).
func TestSOCKSUDPRelayForeignSource(t *testing.T) {
	const bound = `
import socket, sys, time
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
time.sleep(5)
`
	_, udpEcho := echoServers(t, ipfamily.V4)
	addr, secret := startSOCKS(t)
	for _, lo := range []string{"127.0.0.1", "::1"} {
		t.Run(lo, func(t *testing.T) {
			if lo == "::1" {
				if l, err := net.ListenPacket("udp6", "[::1]:0"); err != nil {
					t.Skipf("no IPv6 loopback: %v", err)
				} else {
					l.Close()
				}
			}
			cmd, out := asNobody(t, bound, lo)
			port := firstLine(out)
			theirs := netip.AddrPortFrom(netip.MustParseAddr(lo), uint16(mustAtoi(t, strings.TrimSpace(port))))
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			msg := append([]byte{5, 1, 2, 1, 3, 'j', 'o', 'b', byte(len(secret))}, secret...)
			msg = appendAddr(append(msg, 5, CmdUDPRelay, 0), udpEcho)
			msg = appendAddr(msg, theirs)
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			rep := make([]byte, 6)
			if _, err := io.ReadFull(c, rep); err != nil {
				t.Fatal(err)
			}
			if rep[4] != 5 || rep[5] == repOK {
				t.Errorf("relay for another user's socket %v: reply %v, want a failure", theirs, rep)
			}
			cmd.Process.Kill()
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("port %q: %v", s, err)
	}
	return n
}
