// SPDX-License-Identifier: MIT

package topology_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

func TestMain(m *testing.M) { topology.Main(m) }

// TestIsolation checks the property every Airlock test relies on: without
// the gateway, cn cannot reach inet, while each link works.
func TestIsolation(t *testing.T) {
	t.Parallel()
	tp := topology.New(t)
	port, _ := tp.StartHTTP(t, map[string]int64{"f": 1024})
	web := netip.AddrPortFrom(tp.INETAddr, uint16(port))

	if tp.TCPCheck(t, tp.CN, nil, web) {
		t.Fatalf("cn reached inet %v directly; want no route", web)
	}
	code, _, stderr := tp.Run(t, 10*time.Second, tp.CN, nil, "ip", "route", "get", tp.INETAddr.String())
	if code == 0 {
		t.Errorf("cn has a route to %v; want none", tp.INETAddr)
	} else if !strings.Contains(stderr, "unreachable") {
		t.Logf("ip route get: %s", stderr)
	}
	// inet must not know cn's link either.
	if code, out, _ := tp.Run(t, 10*time.Second, tp.INET, nil, "ip", "route", "get", tp.CNAddr.String()); code == 0 {
		t.Errorf("inet has a route to cn %v: %s", tp.CNAddr, out)
	}
	// dmz reaches both sides.
	if !tp.TCPCheck(t, tp.DMZ, nil, web) {
		t.Errorf("dmz cannot reach inet %v", web)
	}
	lst := netip.AddrPortFrom(tp.CNAddr, uint16(tp.Port()))
	tp.StartTCPListener(t, tp.CN, lst)
	if !tp.TCPCheck(t, tp.DMZ, nil, lst) {
		t.Errorf("dmz cannot reach cn %v", lst)
	}
	if code, out, _ := tp.Run(t, 5*time.Second, tp.DMZ, nil, "sysctl", "-n", "net.ipv4.ip_forward"); strings.TrimSpace(out) != "0" {
		t.Errorf("dmz ip_forward = %q (exit %d), want 0", out, code)
	}
}

func TestNativeRouting(t *testing.T) {
	t.Parallel()
	tp := topology.New(t, topology.WithNativeRouting(), topology.WithRate("1gbit"))
	u := topology.EnsureUser(t)
	port, sha := tp.StartHTTP(t, map[string]int64{"blob": 3 << 20})
	web := netip.AddrPortFrom(tp.INETAddr, uint16(port))
	if !tp.TCPCheck(t, tp.CN, u, web) {
		t.Fatalf("with native routing, cn (as %s) cannot reach %v", u.Name, web)
	}
	// A real transfer through the capped links, verified end to end.
	code, out, stderr := tp.Run(t, 30*time.Second, tp.CN, u, "sh", "-c",
		"curl -sS --max-time 20 http://"+web.String()+"/blob | sha256sum")
	if code != 0 || !strings.HasPrefix(out, sha["blob"]) {
		t.Fatalf("curl | sha256sum: exit %d, got %q, want %s; stderr: %s", code, out, sha["blob"], stderr)
	}
	code, out, _ = tp.Run(t, 5*time.Second, tp.CN, nil, "tc", "qdisc", "show", "dev", topology.IfCNToDMZ)
	if code != 0 || !strings.Contains(out, "tbf") {
		t.Errorf("cn qdisc: exit %d, %q; want tbf", code, out)
	}
}

func TestPeers(t *testing.T) {
	t.Parallel()
	tp := topology.New(t, topology.WithNativeRouting())
	u := topology.EnsureUser(t)
	peer := topology.BuildPeer(t)

	t.Run("dns", func(t *testing.T) {
		dns := tp.StartDNS(t, map[string]netip.Addr{"files.airlock.test.": tp.INETAddr})
		tp.SetResolvConf(tp.CN, dns)
		code, out, stderr := tp.Run(t, 20*time.Second, tp.CN, u, "getent", "hosts", "files.airlock.test")
		if code != 0 || !strings.HasPrefix(out, tp.INETAddr.String()) {
			t.Errorf("getent hosts files.airlock.test: exit %d, %q, %s; want %v", code, out, stderr, tp.INETAddr)
		}
		if code, out, _ := tp.Run(t, 20*time.Second, tp.CN, u, "getent", "hosts", "nope.airlock.test"); code == 0 {
			t.Errorf("getent hosts nope.airlock.test: exit 0, %q; want NXDOMAIN failure", out)
		}
		if _, err := exec.LookPath("dig"); err == nil {
			code, out, stderr := tp.Run(t, 20*time.Second, tp.CN, u, "dig", "+short", "+tcp", "files.airlock.test")
			if code != 0 || strings.TrimSpace(out) != tp.INETAddr.String() {
				t.Errorf("dig +tcp: exit %d, %q, %s", code, out, stderr)
			}
		}
	})
	t.Run("udpecho", func(t *testing.T) {
		port := tp.StartUDPEcho(t)
		ap := netip.AddrPortFrom(tp.INETAddr, uint16(port))
		code, out, stderr := tp.Run(t, 70*time.Second, tp.CN, u, peer, "udpclient", ap.String(), "1000")
		if code != 0 || strings.TrimSpace(out) != "ok 1000" {
			t.Errorf("udpclient: exit %d, %q, %s", code, out, stderr)
		}
	})
	t.Run("iperf3", func(t *testing.T) {
		if _, err := exec.LookPath("iperf3"); err != nil {
			t.Skip("iperf3 not installed")
		}
		port := tp.StartIperf3Server(t)
		code, out, stderr := tp.Run(t, 20*time.Second, tp.CN, u, "iperf3", "-c", tp.INETAddr.String(), "-p", itoa(port), "-t", "1", "--connect-timeout", "3000")
		if code != 0 {
			t.Errorf("iperf3: exit %d\n%s\n%s", code, out, stderr)
		}
	})
	t.Run("user", func(t *testing.T) {
		code, out, _ := tp.Run(t, 5*time.Second, tp.CN, u, "id", "-u")
		if code != 0 || strings.TrimSpace(out) != itoa(u.UID) {
			t.Errorf("id -u as %s: exit %d, %q, want %d", u.Name, code, out, u.UID)
		}
	})
}

// TestCleanup checks that namespaces and processes are gone after the
// test that created them has finished.
func TestCleanup(t *testing.T) {
	t.Parallel()
	var tp *topology.Topology
	var pid int
	t.Run("build", func(t *testing.T) {
		tp = topology.New(t)
		tp.SetResolvConf(tp.DMZ, tp.INETAddr)
		p := tp.Start(t, tp.CN, nil, "sleep", "300")
		pid = p.Cmd.Process.Pid
		// Also a process that escaped the harness's process group.
		tp.Run(t, 5*time.Second, tp.DMZ, nil, "sh", "-c", "setsid sleep 300 >/dev/null 2>&1 &")
	})
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range tp.Namespaces() {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == ns {
				t.Errorf("namespace %s still listed after cleanup", ns)
			}
		}
	}
	if _, err := exec.Command("ls", "/etc/netns/"+tp.DMZ).CombinedOutput(); err == nil {
		t.Errorf("/etc/netns/%s still exists", tp.DMZ)
	}
	if err := exec.Command("kill", "-0", itoa(pid)).Run(); err == nil {
		t.Errorf("process %d still alive after cleanup", pid)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestSecondDMZ checks the second gateway host: it reaches inet's peers
// and cn, cn reaches it but still not inet, and it goes away at cleanup.
func TestSecondDMZ(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("build", func(t *testing.T) {
		tp := topology.New(t, topology.WithSecondDMZ())
		name = tp.DMZ2
		port, _ := tp.StartHTTP(t, map[string]int64{"f": 1024})
		web := netip.AddrPortFrom(tp.INETAddr, uint16(port))
		if !tp.TCPCheck(t, tp.DMZ2, nil, web) {
			t.Errorf("dmz2 cannot reach inet %v", web)
		}
		if tp.TCPCheck(t, tp.CN, nil, web) {
			t.Errorf("cn reached inet %v directly; want no route", web)
		}
		lst := netip.AddrPortFrom(topology.DMZ2AddrCN, uint16(tp.Port()))
		tp.StartTCPListener(t, tp.DMZ2, lst)
		if !tp.TCPCheck(t, tp.CN, nil, lst) {
			t.Errorf("cn cannot reach dmz2 %v", lst)
		}
		if len(tp.Namespaces()) != 4 {
			t.Errorf("namespaces %v, want cn, dmz, inet, dmz2", tp.Namespaces())
		}
	})
	if _, err := topology.NetnsInode(name); err == nil {
		t.Errorf("namespace %s left behind", name)
	}
}

// TestThirdDMZ checks the third gateway host like TestSecondDMZ: it
// reaches inet's peers, cn reaches it, and it goes away at cleanup.
func TestThirdDMZ(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("build", func(t *testing.T) {
		tp := topology.New(t, topology.WithThirdDMZ())
		name = tp.DMZ3
		port, _ := tp.StartHTTP(t, map[string]int64{"f": 1024})
		web := netip.AddrPortFrom(tp.INETAddr, uint16(port))
		for _, ns := range []string{tp.DMZ2, tp.DMZ3} {
			if !tp.TCPCheck(t, ns, nil, web) {
				t.Errorf("%s cannot reach inet %v", ns, web)
			}
		}
		lst := netip.AddrPortFrom(topology.DMZ3AddrCN, uint16(tp.Port()))
		tp.StartTCPListener(t, tp.DMZ3, lst)
		if !tp.TCPCheck(t, tp.CN, nil, lst) {
			t.Errorf("cn cannot reach dmz3 %v", lst)
		}
		if len(tp.Namespaces()) != 5 {
			t.Errorf("namespaces %v, want cn, dmz, inet, dmz2, dmz3", tp.Namespaces())
		}
	})
	if _, err := topology.NetnsInode(name); err == nil {
		t.Errorf("namespace %s left behind", name)
	}
}

// TestTUNNode: a command run through a TUNNode sees /dev/net/tun with the
// node's mode (an unprivileged user opens it read-write at 0666, not at
// 0600), and the host's device keeps its mode.
func TestTUNNode(t *testing.T) {
	topology.RequireRoot(t)
	u := topology.EnsureUser(t)
	before, err := os.Stat(topology.TUNPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o666, true}, {0o600, false}} {
		argv := topology.NewTUNNode(t, tc.mode).Command(u, "sh", "-c", `stat -c %a `+topology.TUNPath+` && exec 3<>`+topology.TUNPath+` && echo opened`)
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if got := strings.Contains(string(out), "opened"); got != tc.ok || !strings.HasPrefix(string(out), fmt.Sprintf("%o\n", tc.mode)) {
			t.Errorf("as %s with a %04o node: opened %v, want %v: %v\n%s", u.Name, tc.mode, got, tc.ok, err, out)
		}
	}
	after, err := os.Stat(topology.TUNPath)
	if err != nil {
		t.Fatal(err)
	}
	if before.Mode() != after.Mode() {
		t.Errorf("host's %s changed from %v to %v", topology.TUNPath, before.Mode(), after.Mode())
	}
}
