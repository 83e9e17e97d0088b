// SPDX-License-Identifier: MIT

package bench

// The peers a user would pick instead of Airlock when root is available on
// both ends: wireguard-go (the WireGuard userspace implementation, here
// the version Airlock itself links) configured through its UAPI socket
// with `wg` from wireguard-tools, and OpenVPN 2.6 over UDP. Both run as
// root in cn and in dmz, as their users run them; dmz forwards and
// masquerades the tunnel subnet to inet0 with nftables, as for ocserv.
// The job is the test user in cn itself: the host's routing sends inet's
// prefix into the tunnel, so every job on the host shares it.

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// hostStack is a tunnel both of whose ends are root daemons, with the job
// as the test user in cn.
type hostStack struct {
	topo     *topology.Topology
	srv, cli int
	udpPort  int
	udpSeen  int64
	proto    string // for messages
}

func (s *hostStack) tp() *topology.Topology      { return s.topo }
func (s *hostStack) job(argv ...string) []string { return argv }
func (s *hostStack) netnsPID() int               { return 0 }
func (s *hostStack) second(*testing.T, logDir) (func(argv ...string) []string, error) {
	return sameJob(s)
}
func (s *hostStack) gatewayRoots() []int { return []int{s.srv} }
func (s *hostStack) clientRoots() []int  { return []int{s.cli} }

// check makes sure the data went through the tunnel's UDP port (a route
// mistake would send it nowhere, but say so plainly if it did not).
func (s *hostStack) check(bytes int64) error {
	n, err := udpCounter(s.topo)
	if err != nil {
		return fmt.Errorf("%s check: %w", s.proto, err)
	}
	d := n - s.udpSeen
	s.udpSeen = n
	if d*2 < bytes {
		return fmt.Errorf("%s: only %d bytes over UDP port %d for %d bytes of iperf3 data", s.proto, d, s.udpPort, bytes)
	}
	return nil
}

// forwardDMZ turns on forwarding in dmz, masquerades subnet to inet0 and
// counts the UDP bytes of port.
func forwardDMZ(t *testing.T, tp *topology.Topology, dir, subnet string, port int) error {
	if code, _, stderr := tp.Run(t, 10*time.Second, tp.DMZ, nil, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); code != 0 {
		return fmt.Errorf("ip_forward: %s", stderr)
	}
	rules := filepath.Join(dir, "dmz.nft")
	if err := os.WriteFile(rules, []byte(natRules(subnet, "inet0")+udpCounterRules(port)), 0o644); err != nil {
		return err
	}
	if code, _, stderr := tp.Run(t, 10*time.Second, tp.DMZ, nil, "nft", "-f", rules); code != 0 {
		return fmt.Errorf("nft: %s", stderr)
	}
	return nil
}

// runAll runs commands as root in ns, stopping at the first failure.
func runAll(t *testing.T, tp *topology.Topology, ns string, cmds ...[]string) error {
	for _, c := range cmds {
		if code, out, stderr := tp.Run(t, 20*time.Second, ns, nil, c[0], c[1:]...); code != 0 {
			return fmt.Errorf("%s: exit %d: %s %s", strings.Join(c, " "), code, out, stderr)
		}
	}
	return nil
}

var wgBuild struct {
	once sync.Once
	path string
	err  error
}

// wireguardGo builds wireguard-go's own command (the module version in
// go.mod, the one Airlock links) into a world-readable directory, once.
func wireguardGo(t *testing.T) (string, error) {
	wgBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "airlock-bench-wg-")
		if err != nil {
			wgBuild.err = err
			return
		}
		_ = os.Chmod(dir, 0o755)
		wgBuild.path = filepath.Join(dir, "wireguard-go")
		cmd := exec.Command("go", "build", "-o", wgBuild.path, "golang.zx2c4.com/wireguard")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			wgBuild.err = fmt.Errorf("go build wireguard-go: %v: %s", err, out)
		}
	})
	return wgBuild.path, wgBuild.err
}

// wgKey returns a new private key and its public key (wg genkey, wg pubkey).
func wgKey() (priv, pub string, err error) {
	p, err := exec.Command("wg", "genkey").Output()
	if err != nil {
		return "", "", fmt.Errorf("wg genkey: %v", err)
	}
	cmd := exec.Command("wg", "pubkey")
	cmd.Stdin = strings.NewReader(string(p))
	q, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("wg pubkey: %v", err)
	}
	return strings.TrimSpace(string(p)), strings.TrimSpace(string(q)), nil
}

// ifName returns a unique interface name for tp (the UAPI socket
// /var/run/wireguard/NAME.sock is global, interface names are not).
func ifName(prefix string, tp *topology.Topology) string {
	h := sha256.Sum256([]byte(tp.CN))
	return fmt.Sprintf("%s%x", prefix, h[:5])
}

const wgPort = 51820

// newWireguardGo sets up wireguard-go in dmz (10.210.0.1, listening on
// wgPort) and in cn (10.210.0.2, peer endpoint dmz, inet's prefix routed
// into the tunnel), each configured with `wg setconf`.
func newWireguardGo(t *testing.T, tp *topology.Topology, logs logDir) (stack, error) {
	bin, err := wireguardGo(t)
	if err != nil {
		return nil, err
	}
	dir := topology.TempDir(t)
	srvPriv, srvPub, err := wgKey()
	if err != nil {
		return nil, err
	}
	cliPriv, cliPub, err := wgKey()
	if err != nil {
		return nil, err
	}
	if err := forwardDMZ(t, tp, dir, "10.210.0.0/24", wgPort); err != nil {
		return nil, err
	}
	s := &hostStack{topo: tp, udpPort: wgPort, proto: "wireguard-go"}
	for _, end := range []struct {
		tag, ns, ifname, addr, conf string
		routes                      []string
		pid                         *int
	}{
		{"wireguard-go-server", tp.DMZ, ifName("wgd", tp), "10.210.0.1/24",
			fmt.Sprintf("[Interface]\nPrivateKey = %s\nListenPort = %d\n\n[Peer]\nPublicKey = %s\nAllowedIPs = 10.210.0.2/32\n", srvPriv, wgPort, cliPub),
			nil, &s.srv},
		{"wireguard-go-client", tp.CN, ifName("wgc", tp), "10.210.0.2/24",
			fmt.Sprintf("[Interface]\nPrivateKey = %s\n\n[Peer]\nPublicKey = %s\nEndpoint = %s:%d\nAllowedIPs = 10.210.0.0/24, %s\n", cliPriv, srvPub, tp.DMZAddrCN, wgPort, topology.INETPrefix),
			[]string{topology.INETPrefix.String()}, &s.cli},
	} {
		conf := filepath.Join(dir, end.ifname+".conf")
		if err := os.WriteFile(conf, []byte(end.conf), 0o600); err != nil {
			return nil, err
		}
		d := startDaemon(t, tp, logs, end.tag, end.ns, nil, "", "env", "WG_PROCESS_FOREGROUND=1", bin, "-f", end.ifname)
		*end.pid = d.pid()
		sock := "/var/run/wireguard/" + end.ifname + ".sock"
		t.Cleanup(func() { _ = os.Remove(sock) })
		if err := waitUntil(10*time.Second, d, func() bool { _, err := os.Stat(sock); return err == nil }); err != nil {
			return nil, fmt.Errorf("wireguard-go: %v: %s", err, d.describe())
		}
		cmds := [][]string{{"wg", "setconf", end.ifname, conf}, {"ip", "addr", "add", end.addr, "dev", end.ifname},
			{"ip", "link", "set", end.ifname, "up"}}
		if tp.LinkMTU >= 1500+80 {
			// Its best on jumbo links (linkJumbo): the outside's 1500.
			cmds = append(cmds, []string{"ip", "link", "set", end.ifname, "mtu", "1500"})
		}
		for _, r := range end.routes {
			cmds = append(cmds, []string{"ip", "route", "add", r, "dev", end.ifname})
		}
		if err := runAll(t, tp, end.ns, cmds...); err != nil {
			return nil, fmt.Errorf("wireguard-go: %v: %s", err, d.describe())
		}
	}
	if err := waitUntil(15*time.Second, nil, func() bool { return tcpCheckIn(t, tp, hostPeer(t)) }); err != nil {
		return nil, fmt.Errorf("wireguard-go: no path to inet: %v: %s", err, lastProbe)
	}
	return s, nil
}

// hostPeer runs airlock-testpeer directly (in cn, as the test user).
func hostPeer(t *testing.T) func(args ...string) []string {
	return func(args ...string) []string { return append([]string{topology.BuildPeer(t)}, args...) }
}

const ovpnPort = 1194

// newOpenVPN sets up OpenVPN 2.6 over UDP: a TLS server in dmz and a TLS
// client in cn, point to point (10.211.0.1 ↔ 10.211.0.2), each with a
// self-signed certificate pinned by the other's SHA-256 fingerprint
// (--peer-fingerprint, OpenVPN 2.6's small-setup alternative to a CA),
// AEAD data channel (AES-256-GCM, negotiated from --data-ciphers), the
// default MTU settings (tun-mtu 1500, mssfix 1492), user-space data path
// (--disable-dco: Debian 12's OpenVPN 2.6 speaks the out-of-tree ovpn-dco
// module, which this kernel does not have).
func newOpenVPN(t *testing.T, tp *topology.Topology, logs logDir) (stack, error) {
	dir := topology.TempDir(t)
	fp := map[string]string{}
	for _, n := range []string{"server", "client"} {
		key, crt := filepath.Join(dir, n+".key"), filepath.Join(dir, n+".crt")
		if out, err := exec.Command("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
			"-nodes", "-subj", "/CN=openvpn-bench-"+n, "-days", "2", "-keyout", key, "-out", crt).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("openssl req: %v: %s", err, out)
		}
		out, err := exec.Command("openssl", "x509", "-in", crt, "-noout", "-fingerprint", "-sha256").Output()
		if err != nil {
			return nil, fmt.Errorf("openssl x509 -fingerprint: %v", err)
		}
		_, f, ok := strings.Cut(strings.TrimSpace(string(out)), "=")
		if !ok {
			return nil, fmt.Errorf("openssl x509 -fingerprint: %q", out)
		}
		fp[n] = f
	}
	if err := forwardDMZ(t, tp, dir, "10.211.0.0/24", ovpnPort); err != nil {
		return nil, err
	}
	common := "dev tun\nproto udp4\ndata-ciphers AES-256-GCM:CHACHA20-POLY1305\ndisable-dco\nverb 3\npersist-key\n"
	srv := common + fmt.Sprintf("local %s\nport %d\ntls-server\ndh none\ncert %s\nkey %s\npeer-fingerprint %s\nifconfig 10.211.0.1 10.211.0.2\n",
		tp.DMZAddrCN, ovpnPort, filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), fp["client"])
	cli := common + fmt.Sprintf("remote %s %d\nnobind\ntls-client\ncert %s\nkey %s\npeer-fingerprint %s\nifconfig 10.211.0.2 10.211.0.1\nroute %s 255.255.255.0\n",
		tp.DMZAddrCN, ovpnPort, filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"), fp["server"], topology.INETPrefix.Addr())
	for n, c := range map[string]string{"server": srv, "client": cli} {
		if err := os.WriteFile(filepath.Join(dir, n+".conf"), []byte(c), 0o600); err != nil {
			return nil, err
		}
	}
	sd := startDaemon(t, tp, logs, "openvpn-server", tp.DMZ, nil, "", "openvpn", "--config", filepath.Join(dir, "server.conf"))
	cd := startDaemon(t, tp, logs, "openvpn-client", tp.CN, nil, "", "openvpn", "--config", filepath.Join(dir, "client.conf"))
	s := &hostStack{topo: tp, srv: sd.pid(), cli: cd.pid(), udpPort: ovpnPort, proto: "openvpn"}
	if err := waitUntil(30*time.Second, cd, func() bool { return cd.contains("Initialization Sequence Completed") }); err != nil {
		return nil, fmt.Errorf("openvpn client: %v: %s\n--- server ---\n%s", err, cd.describe(), sd.describe())
	}
	if !cd.contains("Data Channel: cipher 'AES-256-GCM'") {
		return nil, fmt.Errorf("openvpn: data channel is not AES-256-GCM: %s", cd.describe())
	}
	if err := waitUntil(15*time.Second, cd, func() bool { return tcpCheckIn(t, tp, hostPeer(t)) }); err != nil {
		return nil, fmt.Errorf("openvpn: no path to inet: %v: %s", err, lastProbe)
	}
	return s, nil
}
