// SPDX-License-Identifier: MIT

package topology

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TempDir returns a new directory with mode 0755 (readable by the test
// user, unlike t.TempDir), removed at cleanup.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "airlock-test-")
	if err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("TempDir: %v", err)
	}
	return dir
}

// StartIperf3Server starts iperf3 -s in inet (as root), waits until it
// listens and returns its port. It serves tests one after another until
// cleanup kills it.
func (tp *Topology) StartIperf3Server(t testing.TB) int {
	t.Helper()
	port := tp.Port()
	p := tp.Start(t, tp.INET, nil, "iperf3", "-s", "--forceflush", "-p", strconv.Itoa(port))
	tp.waitFor(t, p, 10*time.Second, func() bool {
		return strings.Contains(p.Stdout(), "Server listening")
	})
	return port
}

// StartHTTP writes the files (name → size in bytes, deterministic content
// from a PRNG seeded by the name) into a directory, serves it with a Go
// net/http file server in inet on all addresses, waits until it accepts
// connections and returns its port and the hex SHA-256 of each file.
func (tp *Topology) StartHTTP(t testing.TB, files map[string]int64) (port int, sha map[string]string) {
	t.Helper()
	return tp.StartHTTPIn(t, tp.INET, tp.INETAddr, files)
}

// StartHTTPIn is StartHTTP in namespace ns, waiting for it on addr.
func (tp *Topology) StartHTTPIn(t testing.TB, ns string, addr netip.Addr, files map[string]int64) (port int, sha map[string]string) {
	t.Helper()
	dir := TempDir(t)
	sha = map[string]string{}
	for name, size := range files {
		sum, err := writeFile(filepath.Join(dir, name), size)
		if err != nil {
			t.Fatalf("StartHTTP: %v", err)
		}
		sha[name] = sum
	}
	port = tp.Port()
	p := tp.Start(t, ns, nil, BuildPeer(t), "http", dir, tp.listenAny(ns, port))
	tp.WaitTCP(t, ns, netip.AddrPortFrom(addr, uint16(port)), p)
	return port, sha
}

// Content returns a reader of the deterministic content StartHTTP serves
// for name.
func Content(name string, size int64) io.Reader {
	seed := sha256.Sum256([]byte("airlock-test-file/" + name))
	return io.LimitReader(rand.NewChaCha8(seed), size)
}

func writeFile(path string, size int64) (string, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(f, h), 1<<20)
	if _, err := io.Copy(w, Content(filepath.Base(path), size)); err != nil {
		f.Close()
		return "", err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// StartDNS starts a DNS server (github.com/miekg/dns) on inet's address,
// port 53, UDP and TCP, answering A records for zone (names with or
// without the final dot) and NXDOMAIN for other names. It returns the
// server's address.
func (tp *Topology) StartDNS(t testing.TB, zone map[string]netip.Addr) netip.Addr {
	t.Helper()
	return tp.StartDNSIn(t, tp.INET, tp.INETAddr, zone)
}

// StartDNSIn is StartDNS in namespace ns on addr.
func (tp *Topology) StartDNSIn(t testing.TB, ns string, addr netip.Addr, zone map[string]netip.Addr) netip.Addr {
	t.Helper()
	z := make(map[string][]netip.Addr, len(zone))
	for name, a := range zone {
		z[name] = []netip.Addr{a}
	}
	return tp.StartDNSZone(t, ns, addr, z)
}

// StartDNSZone is StartDNSIn for names with several addresses: A records
// for the IPv4 ones, AAAA for the IPv6 ones.
func (tp *Topology) StartDNSZone(t testing.TB, ns string, addr netip.Addr, zone map[string][]netip.Addr) netip.Addr {
	t.Helper()
	raw := map[string][]string{}
	for name, as := range zone {
		for _, a := range as {
			raw[name] = append(raw[name], a.String())
		}
	}
	b, err := json.Marshal(raw)
	if err != nil {
		t.Fatalf("StartDNS: %v", err)
	}
	zf := filepath.Join(TempDir(t), "zone.json")
	if err := os.WriteFile(zf, b, 0o644); err != nil {
		t.Fatalf("StartDNS: %v", err)
	}
	ap := netip.AddrPortFrom(addr, 53)
	p := tp.Start(t, ns, nil, BuildPeer(t), "dns", ap.String(), zf)
	tp.WaitTCP(t, ns, ap, p)
	return addr
}

// StartUDPEcho starts a UDP echo server in inet on all addresses and
// returns its port once it echoes.
func (tp *Topology) StartUDPEcho(t testing.TB) int {
	t.Helper()
	port := tp.Port()
	p := tp.Start(t, tp.INET, nil, BuildPeer(t), "udpecho", tp.listenAny(tp.INET, port))
	peer := BuildPeer(t)
	ap := netip.AddrPortFrom(tp.INETAddr, uint16(port)).String()
	tp.waitFor(t, p, 10*time.Second, func() bool {
		code, _, _ := tp.Run(t, 5*time.Second, tp.INET, nil, peer, "udpclient", ap, "1")
		return code == 0
	})
	return port
}

// StartTCPListener starts a TCP server on addr in namespace ns that greets
// every connection with "hello\n", and waits until it accepts connections.
func (tp *Topology) StartTCPListener(t testing.TB, ns string, addr netip.AddrPort) *Process {
	t.Helper()
	p := tp.Start(t, ns, nil, BuildPeer(t), "tcplisten", addr.String())
	check := addr
	if addr.Addr().IsUnspecified() {
		check = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), addr.Port())
	}
	tp.WaitTCP(t, ns, check, p)
	return p
}

// StartTCPSrcPort starts a server in inet on all addresses that answers
// every TCP connection with the client's IP:PORT as it saw them, and
// returns its port once it accepts connections.
func (tp *Topology) StartTCPSrcPort(t testing.TB) int {
	t.Helper()
	port := tp.Port()
	p := tp.Start(t, tp.INET, nil, BuildPeer(t), "tcpsrcport", tp.listenAny(tp.INET, port))
	tp.WaitTCP(t, tp.INET, netip.AddrPortFrom(tp.INETAddr, uint16(port)), p)
	return port
}

// TCPCheck reports whether a TCP connection from namespace ns, as u (nil
// means root), to addr succeeds within 2 s.
func (tp *Topology) TCPCheck(t testing.TB, ns string, u *User, addr netip.AddrPort) bool {
	t.Helper()
	code, _, _ := tp.Run(t, 10*time.Second, ns, u, BuildPeer(t), "tcpcheck", addr.String())
	return code == 0
}

// WaitTCP polls (up to 10 s) until a TCP connection from ns to addr
// succeeds. If p exits meanwhile, or time runs out, it fails the test with
// p's output.
func (tp *Topology) WaitTCP(t testing.TB, ns string, addr netip.AddrPort, p *Process) {
	t.Helper()
	tp.waitFor(t, p, 10*time.Second, func() bool { return tp.TCPCheck(t, ns, nil, addr) })
}

// waitFor polls ready (Poll) until it returns true, p exits, or timeout
// passes; the last two fail the test.
func (tp *Topology) waitFor(t testing.TB, p *Process, timeout time.Duration, ready func() bool) {
	t.Helper()
	exited := false
	if Poll(timeout, func() bool {
		exited, _ = p.Exited()
		return exited || ready()
	}) && !exited {
		return
	}
	if exited {
		t.Fatalf("peer exited before it was ready: %s", p.Describe())
	}
	t.Fatalf("peer not ready after %v: %s", timeout, p.Describe())
}

// StartTCPSink starts a server in inet on all addresses that holds every
// TCP connection open until the client closes it, and returns its port
// once it accepts connections.
func (tp *Topology) StartTCPSink(t testing.TB) int {
	t.Helper()
	port := tp.Port()
	p := tp.Start(t, tp.INET, nil, BuildPeer(t), "tcpsink", tp.listenAny(tp.INET, port))
	tp.WaitTCP(t, tp.INET, netip.AddrPortFrom(tp.INETAddr, uint16(port)), p)
	return port
}
