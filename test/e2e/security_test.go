// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// leakScript is a job that shows everything of the node's credentials it
// can read: its environment, /proc/self/environ, the environment of every
// process it may read, and ps -ef (every command line on the node).
const leakScript = `echo ENV; env; echo SELF; tr '\0' '\n' </proc/self/environ; echo; echo ALL;
for f in /proc/[0-9]*/environ; do tr '\0' '\n' <"$f" 2>/dev/null; echo; done; echo PS; ps -ef; echo END`

// TestClientSecurity checks what a job and another user of the node can get
// from airlock run (docs/security.md): the job sees no join token (netns
// and a fallback mode; token in the environment or in a file), and in the
// fallback modes another unprivileged user gets nothing through the job's
// proxies, its UDP association or its exposed ports, while the job's own
// traffic flows.
func TestClientSecurity(t *testing.T) {
	// The neighbour check exposes 8080 and 8081 (exposure is off by
	// default).
	e := newEnvMode(t, modeUser, "--expose-ports", "8080-8081")
	topology.BuildPreload(t)
	dir := topology.TempDir(t)
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(e.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tokFile, e.u.UID, e.u.GID); err != nil {
		t.Fatal(err)
	}

	t.Run("TokenNotInJob", func(t *testing.T) {
		for _, mode := range []string{"netns", "preload"} {
			for _, how := range []string{"env", "file"} {
				o := runOpts{flags: []string{"--mode", mode}}
				if how == "env" {
					o.viaEnv = true
				} else {
					o.tokenFile = tokFile
				}
				code, out, stderr := e.runWith(t, o, "sh", "-c", leakScript)
				if code != 0 || !strings.HasSuffix(strings.TrimSpace(out), "END") {
					t.Fatalf("%s, token by %s: exit %d%s", mode, how, code, e.diag(stderr))
				}
				if strings.Contains(out, e.token) {
					for _, l := range strings.Split(out, "\n") {
						if strings.Contains(l, e.token) {
							t.Errorf("%s, token by %s: the job sees the token: %q", mode, how, l)
						}
					}
				}
				// The job could read environments and command lines (else
				// the check above proves nothing).
				_, all, _ := strings.Cut(out, "\nALL\n")
				if !strings.Contains(all, "PATH=") {
					t.Errorf("%s, token by %s: the job read no process's environment: %q", mode, how, all)
				}
				if how == "file" && !strings.Contains(out, "--token-file") {
					t.Errorf("%s: ps in the job does not show airlock run's command line: %q", mode, out)
				}
				if strings.Contains(stderr, "warning: --token") {
					t.Errorf("%s, token by %s: airlock warns about --token: %q", mode, how, stderr)
				}
			}
		}
		// The harness's default, --token on the command line, is warned of.
		if _, _, stderr := e.run(t, "true"); !strings.Contains(stderr, "--token on the command line is visible to every user") {
			t.Errorf("--token: no warning on stderr: %q", stderr)
		}
	})

	t.Run("NeighbourFallback", func(t *testing.T) {
		n := topology.EnsureNamedUser(t, topology.NeighbourUserName)
		checkNeighbourProxies(t, e, n, dir)
		checkNeighbourExpose(t, e, n, dir)
	})
}

// assocJob opens a UDP association through the job's SOCKS proxy
// (ALL_PROXY), prints where its proxies and the association are, waits for
// the file FLAG, then echoes N datagrams through the association and
// prints "ok N".
const assocJob = `
import os, socket, struct, sys, time
from urllib.parse import urlparse
ip, port, flag, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
u = urlparse(os.environ["ALL_PROXY"])
h = urlparse(os.environ["http_proxy"])
c = socket.create_connection((u.hostname, u.port), timeout=5)
user, pw = u.username.encode(), u.password.encode()
c.sendall(bytes([5, 1, 2]) + bytes([1, len(user)]) + user + bytes([len(pw)]) + pw + bytes([5, 3, 0, 1, 0, 0, 0, 0, 0, 0]))
r = b""
while len(r) < 14:
    r += c.recv(14 - len(r))
assert r[:4] == bytes([5, 2, 1, 0]) and r[5] == 0, r
bnd = (socket.inet_ntoa(r[8:12]), struct.unpack(">H", r[12:14])[0])
s6 = os.environ.get("AIRLOCK_SOCKS6", "[::1]:0").rsplit(":", 1)[1]
print("at", u.hostname, u.port, h.port, bnd[0], bnd[1], s6, flush=True)
for i in range(400):
    if os.path.exists(flag):
        break
    time.sleep(0.05)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1)
hdr = bytes([0, 0, 0, 1]) + socket.inet_aton(ip) + struct.pack(">H", port)
ok = 0
for i in range(n):
    m = ("job datagram %d" % i).encode()
    for attempt in range(5):
        s.sendto(hdr + m, bnd)
        try:
            d, a = s.recvfrom(4096)
            if d[10:] == m:
                ok += 1
                break
        except socket.timeout:
            pass
print("ok", ok, flush=True)
`

// neighbourProbe is another user trying the job's proxies: a datagram to
// the association (first, to claim it), a SOCKS greeting, an HTTP request.
// It prints what came back of each.
const neighbourProbe = `
import socket, struct, sys
lo, sport, hport, bip, bport, s6port, ip, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7], int(sys.argv[8])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(bytes([0, 0, 0, 1]) + socket.inet_aton(ip) + struct.pack(">H", port) + b"neighbour", (bip, bport))
try:
    print("udp got", s.recvfrom(4096)[0])
except socket.timeout:
    print("udp nothing")
for name, p, msg in (("socks", sport, bytes([5, 1, 2])), ("http", hport, b"GET http://%s:%d/ HTTP/1.1\r\nHost: x\r\n\r\n" % (ip.encode(), port))):
    try:
        c = socket.create_connection((lo, p), timeout=2)
        c.settimeout(2)
        c.sendall(msg)
        d = c.recv(100)
        print(name, "got", d) if d else print(name, "nothing", "closed")
    except (socket.timeout, ConnectionResetError, BrokenPipeError) as e:
        print(name, "nothing", type(e).__name__)
    # IPv6 loopback: the SOCKS proxy's listener there (for the preload
    # library's IPv6-only sockets) and the HTTP proxy's port: nothing of
    # the job's may answer.
    try:
        c = socket.create_connection(("::1", s6port if name == "socks" else p), timeout=2)
        c.settimeout(2)
        c.sendall(msg)
        d = c.recv(100)
        print(name + "6", "got", d) if d else print(name + "6", "nothing", "closed")
    except OSError as e:
        print(name + "6", "nothing", type(e).__name__)
`

// checkNeighbourProxies: in proxy mode, another user of the node gets
// nothing through the job's SOCKS and HTTP proxies or its UDP association
// (trying it first), and the job's datagrams still echo.
func checkNeighbourProxies(t *testing.T, e *env, n *topology.User, dir string) {
	job, probe := filepath.Join(dir, "assoc.py"), filepath.Join(dir, "probe.py")
	for f, s := range map[string]string{job: assocJob, probe: neighbourProbe} {
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flag := filepath.Join(dir, "probed")
	inet := e.tp.INETAddr.String()
	p := e.startWith(t, runOpts{flags: []string{"--mode", "proxy"}}, "/usr/bin/python3", job, inet, fmt.Sprint(e.udpPort), flag, "5")
	var at []string
	if !topology.Poll(30*time.Second, func() bool {
		for _, l := range strings.Split(p.Stdout(), "\n") {
			if f := strings.Fields(l); len(f) == 7 && f[0] == "at" {
				at = f[1:]
			}
		}
		ok, _ := p.Exited()
		return at != nil || ok
	}) || at == nil {
		t.Fatalf("proxy-mode job did not start: %s%s", p.Describe(), e.diag(p.Stderr()))
	}
	if at[5] == "0" {
		t.Errorf("the job has no AIRLOCK_SOCKS6 (the SOCKS proxy on ::1): the neighbour cannot be tried there")
	}
	code, out, stderr := e.tp.Run(t, 20*time.Second, e.tp.CN, n, "/usr/bin/python3", append([]string{probe}, append(at, inet, fmt.Sprint(e.udpPort))...)...)
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("neighbour probe: exit %d %q %q", code, out, stderr)
	}
	for _, want := range []string{"udp nothing", "socks nothing", "http nothing", "socks6 nothing", "http6 nothing"} {
		if !strings.Contains(out, want) {
			t.Errorf("another user got through the job's proxies: %q, want %q", out, want)
		}
	}
	if _, err := p.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Stdout(), "ok 5") {
		t.Errorf("the job's own datagrams after the neighbour's try: %q, want ok 5%s", p.Stdout(), e.diag(p.Stderr()))
	}
}

// neighbourListener is another user's loopback service on PORT: it answers
// "hello from the neighbour" and prints "accepted" per connection, for
// SECONDS.
const neighbourListener = `
import socket, sys, time
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(5)
print("listening", flush=True)
l.settimeout(float(sys.argv[2]))
try:
    while True:
        c, a = l.accept()
        print("accepted", flush=True)
        c.sendall(b"hello from the neighbour\n")
        c.close()
except socket.timeout:
    pass
`

// checkNeighbourExpose: in seccomp mode, a job exposes 8080 (where another
// user listens on the node's loopback, not the job) and 8081 (where the job
// listens). A connection from inet to the first must not reach the
// neighbour's service; the second reaches the job.
func checkNeighbourExpose(t *testing.T, e *env, n *topology.User, dir string) {
	lis := filepath.Join(dir, "listener.py")
	if err := os.WriteFile(lis, []byte(neighbourListener), 0o644); err != nil {
		t.Fatal(err)
	}
	nb := e.tp.Start(t, e.tp.CN, n, "/usr/bin/python3", lis, "8080", "20")
	if !nb.WaitStdout("listening", 10*time.Second) {
		t.Fatalf("neighbour's listener did not start: %s", nb.Describe())
	}
	p := e.startWith(t, runOpts{flags: []string{"--mode", "seccomp", "--expose", "8080", "--expose", "8081"}}, e.peer, "jobserve", "8081", "25", "job")
	exposed := map[string]netip.AddrPort{}
	ready := func() bool { return len(exposed) >= 2 && strings.Contains(p.Stdout(), "ready\n") }
	if !topology.Poll(30*time.Second, func() bool {
		for _, l := range strings.Split(p.Stderr(), "\n") {
			if rest, ok := strings.CutPrefix(l, "airlock: exposed tcp/"); ok {
				port, addr, _ := strings.Cut(rest, " at ")
				if ap, err := netip.ParseAddrPort(addr); err == nil {
					exposed[port] = ap
				}
			}
		}
		ok, _ := p.Exited()
		return ready() || ok
	}) || !ready() {
		t.Fatalf("exposing job did not start: %s%s", p.Describe(), e.diag(p.Stderr()))
	}
	if _, out, _ := e.inetGet(t, "tcpget", exposed["8080"]); strings.Contains(out, "neighbour") {
		t.Errorf("a connection to the job's exposed port 8080 reached another user's loopback service: %q", out)
	}
	if code, out, _ := e.inetGet(t, "tcpget", exposed["8081"]); code != 0 || strings.TrimSpace(out) != "hello from job" {
		t.Errorf("the job's own exposed port 8081: exit %d, %q, want hello from job%s", code, out, e.diag(p.Stderr()))
	}
	p.Kill()
	nb.Kill()
	if strings.Contains(nb.Stdout(), "accepted") {
		t.Errorf("another user's loopback service saw a connection for the job's exposed port: %q", nb.Stdout())
	}
	if !strings.Contains(p.Stderr(), "not the job's") {
		t.Errorf("airlock run did not say why it refused the exposed connection: %q", p.Stderr())
	}
}
