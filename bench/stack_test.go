// SPDX-License-Identifier: MIT

package bench

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// stack is one configuration, set up on its own topology.
type stack interface {
	tp() *topology.Topology
	// job returns the argv that runs argv as the test user inside the
	// job's network; it is run in cn.
	job(argv ...string) []string
	// netnsPID is a process whose network namespace is the job's, for
	// probes run as root (ping): 0 means cn's own namespace, -1 that the
	// job has no network namespace of its own (the fallback modes).
	netnsPID() int
	// second returns the job argv wrapper of a second job on the same
	// client host, for the bulk transfer of the latency test: a second
	// `airlock run` or a second openconnect session; for tunnels that the
	// host's routing carries (wireguard-go, OpenVPN, native) the same
	// network, since every job on the host shares them.
	second(t *testing.T, logs logDir) (func(argv ...string) []string, error)
	// check is called after every measured point with the bytes iperf3
	// moved; it fails if the configuration did not carry them as it
	// claims (ocserv-dtls: over UDP).
	check(bytes int64) error
	// gatewayRoots and clientRoots are the PIDs of the process trees whose
	// CPU time is charged to the gateway and the client (empty: n/a).
	gatewayRoots() []int
	clientRoots() []int
}

// newStack builds the topology for cfg and sets the configuration up on
// it; its daemons write their output to files in logs.
func newStack(t *testing.T, cfg, binTag string, opts []topology.Option, logs logDir) (stack, error) {
	bin, err := airlockBin(t, binTag)
	if err != nil {
		return nil, err
	}
	if binTag != "" && cfg != "airlock" && cfg != "airlock-kernel" && cfg != "airlock-netstack" && cfg != "airlock-tcp" {
		return nil, fmt.Errorf("configuration %s@%s: another binary only for airlock, airlock-kernel, airlock-netstack and airlock-tcp", cfg, binTag)
	}
	switch cfg {
	case "native":
		return &nativeStack{topo: topology.New(t, append(opts, topology.WithNativeRouting())...)}, nil
	case "airlock":
		return newAirlock(t, topology.New(t, opts...), logs, bin, "user", "--transport", "udp")
	case "airlock-kernel":
		return newAirlock(t, topology.New(t, opts...), logs, bin, "kernel", "--transport", "udp")
	case "airlock-netstack":
		return newAirlock(t, topology.New(t, opts...), logs, bin, "user-netstack", "--transport", "udp")
	case "airlock-tcp":
		// Airlock (user mode) forced onto its TCP/TLS transport.
		return newAirlock(t, topology.New(t, opts...), logs, bin, "user", "--transport", "tcp")
	case "airlock-seccomp":
		return newAirlockFallback(t, topology.New(t, opts...), logs, "seccomp")
	case "airlock-preload":
		return newAirlockFallback(t, topology.New(t, opts...), logs, "preload")
	case "ocserv":
		return newOcserv(t, topology.New(t, opts...), logs, false, false)
	case "ocserv-dtls":
		return newOcserv(t, topology.New(t, opts...), logs, false, true)
	case "ocserv-ocproxy":
		return newOcproxy(t, topology.New(t, opts...), logs)
	case "ocserv-slirp":
		return newOcserv(t, topology.New(t, opts...), logs, true, false)
	case "slirp":
		return newSlirp(t, topology.New(t, append(opts, topology.WithNativeRouting())...), logs)
	case "wireguard-go":
		return newWireguardGo(t, topology.New(t, opts...), logs)
	case "openvpn":
		return newOpenVPN(t, topology.New(t, opts...), logs)
	}
	return nil, fmt.Errorf("unknown configuration %q", cfg)
}

// sameJob is stack.second for tunnels every job on the host shares.
func sameJob(s stack) (func(argv ...string) []string, error) { return s.job, nil }

// nativeStack is plain routing through dmz: the job runs directly in cn.
type nativeStack struct{ topo *topology.Topology }

func (s *nativeStack) tp() *topology.Topology      { return s.topo }
func (s *nativeStack) job(argv ...string) []string { return argv }
func (s *nativeStack) netnsPID() int               { return 0 }
func (s *nativeStack) second(*testing.T, logDir) (func(argv ...string) []string, error) {
	return sameJob(s)
}
func (s *nativeStack) check(int64) error   { return nil }
func (s *nativeStack) gatewayRoots() []int { return nil }
func (s *nativeStack) clientRoots() []int  { return nil }

// nsJob runs argv inside the user and network namespace of pid, keeping
// the caller's credentials (the namespace maps them).
func nsJob(pid int, argv ...string) []string {
	return append([]string{"nsenter", "-t", strconv.Itoa(pid), "-U", "-n", "--preserve-credentials", "--"}, argv...)
}

// airlockStack is the Airlock gateway in dmz (user mode: unprivileged,
// gVisor netstack; kernel mode: root, kernel TUN, forwarding and nftables
// SNAT to dmz's inet address) and a long-lived `airlock run -- sleep` in
// cn; iperf3 enters the job's namespaces. In kernel mode the gateway tree's
// CPU is WireGuard and the TUN; the kernel's forwarding and NAT are not
// charged to any process (as for ocserv).
type airlockStack struct {
	topo       *topology.Topology
	gw, client int
	jobPID     int
	bin        string   // the airlock binary
	runArgs    []string // airlock run … (without "-- sleep")
}

func (s *airlockStack) tp() *topology.Topology      { return s.topo }
func (s *airlockStack) job(argv ...string) []string { return nsJob(s.jobPID, argv...) }
func (s *airlockStack) netnsPID() int               { return s.jobPID }
func (s *airlockStack) check(int64) error           { return nil }

// second starts a second `airlock run -- sleep` (its own lease and
// tunnel) and returns its job wrapper.
func (s *airlockStack) second(t *testing.T, logs logDir) (func(argv ...string) []string, error) {
	u := topology.EnsureUser(t)
	p := startDaemon(t, s.topo, logs, "airlock-run-2", s.topo.CN, u, "", s.bin, append(s.runArgs, "--", "sleep", "100000")...)
	var pid int
	if err := waitUntil(20*time.Second, p, func() bool {
		pid = findDescendant(p.pid(), "sleep")
		return pid != 0 && tcpCheckIn(t, s.topo, nsJobPeer(t, pid))
	}); err != nil {
		return nil, fmt.Errorf("second airlock run: %v: %s", err, p.describe())
	}
	return func(argv ...string) []string { return nsJob(pid, argv...) }, nil
}
func (s *airlockStack) gatewayRoots() []int { return []int{s.gw} }
func (s *airlockStack) clientRoots() []int  { return []int{s.client} }

// airlockGateway starts the gateway in dmz in egress mode "user" (as the
// test user) or "kernel" (as root, --egress kernel --egress-addr dmz's inet
// address, as test/e2e does) and returns its process, the join values and
// a token.
func airlockGateway(t *testing.T, tp *topology.Topology, logs logDir, bin, mode string) (gw *daemon, gateway, pin, token string, err error) {
	return airlockGatewayEnv(t, tp, logs, bin, mode, nil)
}

// airlockGatewayEnv is airlockGateway with NAME=VALUE variables in the
// gateway's environment (e.g. GOMAXPROCS).
func airlockGatewayEnv(t *testing.T, tp *topology.Topology, logs logDir, bin, mode string, env []string) (gw *daemon, gateway, pin, token string, err error) {
	u := topology.EnsureUser(t)
	tp.SetResolvConf(tp.DMZ, tp.INETAddr)
	base := topology.TempDir(t)
	state := filepath.Join(base, "state")
	listen := fmt.Sprintf("%s:8443", tp.DMZAddrCN)
	args := []string{"gateway", "--state", state, "--listen", listen}
	switch mode {
	case "user", "user-netstack":
		// The gateway creates its state directory (0700) itself.
		if err := os.Chown(base, u.UID, u.GID); err != nil {
			return nil, "", "", "", err
		}
		if mode == "user-netstack" {
			args = append(args, "--tcp-stack", "netstack")
		}
	case "kernel":
		u = nil // root
		args = append(args, "--egress", "kernel", "--egress-addr", tp.DMZAddrINET.String())
	default:
		return nil, "", "", "", fmt.Errorf("unknown egress mode %q", mode)
	}
	// Ping sockets for the user-mode gateway's ICMP echo relay (the
	// latency test's ping), as test/e2e does.
	if code, _, stderr := tp.Run(t, 10*time.Second, tp.DMZ, nil, "sysctl", "-q", "-w", "net.ipv4.ping_group_range=0 2147483647"); code != 0 {
		return nil, "", "", "", fmt.Errorf("ping_group_range: %s", stderr)
	}
	if len(env) > 0 {
		gw = startDaemon(t, tp, logs, "airlock-gateway", tp.DMZ, u, "", "env", append(append(append([]string{}, env...), bin), args...)...)
	} else {
		gw = startDaemon(t, tp, logs, "airlock-gateway", tp.DMZ, u, "", bin, args...)
	}
	if err := waitUntil(30*time.Second, gw, func() bool {
		vals := readEnv(filepath.Join(state, "join.env"))
		gateway, pin = vals["AIRLOCK_GATEWAY"], vals["AIRLOCK_PIN"]
		return gateway != "" && pin != ""
	}); err != nil {
		return nil, "", "", "", fmt.Errorf("gateway did not write join.env: %v: %s", err, gw.describe())
	}
	code, out, stderr := tp.Run(t, 30*time.Second, tp.DMZ, u, bin, "token", "create", "--state", state, "--name", "bench", "--ttl", "24h")
	if code != 0 {
		return nil, "", "", "", fmt.Errorf("token create: exit %d: %s", code, stderr)
	}
	return gw, gateway, pin, strings.TrimSpace(out), nil
}

func readEnv(path string) map[string]string {
	b, _ := os.ReadFile(path)
	vals := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			vals[k] = v
		}
	}
	return vals
}

// newAirlock starts the gateway in egress mode mode and a job; runFlags
// go to airlock run (e.g. --transport tcp).
func newAirlock(t *testing.T, tp *topology.Topology, logs logDir, bin, mode string, runFlags ...string) (stack, error) {
	u := topology.EnsureUser(t)
	gw, gateway, pin, token, err := airlockGateway(t, tp, logs, bin, mode)
	if err != nil {
		return nil, err
	}
	runArgs := append([]string{"run", "--gateway", gateway, "--pin", pin, "--token", token}, runFlags...)
	args := append(append([]string{}, runArgs...), "--", "sleep", "100000")
	p := startDaemon(t, tp, logs, "airlock-run", tp.CN, u, "", bin, args...)
	s := &airlockStack{topo: tp, gw: gw.pid(), client: p.pid(), bin: bin, runArgs: runArgs}
	if err := waitUntil(20*time.Second, p, func() bool {
		s.jobPID = findDescendant(s.client, "sleep")
		return s.jobPID != 0 && tcpCheckIn(t, tp, nsJobPeer(t, s.jobPID))
	}); err != nil {
		return nil, fmt.Errorf("airlock run: %v: %s", err, p.describe())
	}
	return s, nil
}

// airlockFallbackStack is the user-mode Airlock gateway and, for every
// iperf3 run, a fresh `airlock run --mode seccomp|preload -- iperf3 ...` in
// cn, in the host's network namespace: the client's user-space stack, its
// loopback relays and (seccomp) the supervisor or (preload) the SOCKS
// proxy carry the traffic. The client's CPU is not charged: its process
// tree lives only as long as one run.
type airlockFallbackStack struct {
	topo *topology.Topology
	gw   int
	argv []string // airlock run ... --mode M --
}

func (s *airlockFallbackStack) tp() *topology.Topology { return s.topo }
func (s *airlockFallbackStack) job(argv ...string) []string {
	return append(append([]string{}, s.argv...), argv...)
}
func (s *airlockFallbackStack) netnsPID() int     { return -1 }
func (s *airlockFallbackStack) check(int64) error { return nil }
func (s *airlockFallbackStack) second(*testing.T, logDir) (func(argv ...string) []string, error) {
	return sameJob(s) // every run is its own client already
}
func (s *airlockFallbackStack) gatewayRoots() []int { return []int{s.gw} }
func (s *airlockFallbackStack) clientRoots() []int  { return nil }

func newAirlockFallback(t *testing.T, tp *topology.Topology, logs logDir, mode string) (stack, error) {
	u := topology.EnsureUser(t)
	gw, gateway, pin, token, err := airlockGateway(t, tp, logs, topology.BuildAirlock(t), "user")
	if err != nil {
		return nil, err
	}
	topology.BuildPreload(t) // next to the airlock binary
	s := &airlockFallbackStack{topo: tp, gw: gw.pid(),
		argv: []string{topology.BuildAirlock(t), "run", "--gateway", gateway, "--pin", pin, "--token", token, "--mode", mode, "--"}}
	argv := append(append([]string{}, s.argv...), "true")
	if code, out, stderr := tp.Run(t, 30*time.Second, tp.CN, u, argv[0], argv[1:]...); code != 0 || !strings.Contains(stderr, "airlock: mode "+mode) {
		return nil, fmt.Errorf("airlock run --mode %s -- true: exit %d %s %s", mode, code, out, stderr)
	}
	return s, nil
}

// nsJobPeer returns the argv prefix that runs airlock-testpeer in the
// namespaces of pid.
func nsJobPeer(t *testing.T, pid int) func(args ...string) []string {
	return func(args ...string) []string {
		return append([]string{"nsenter", "-t", strconv.Itoa(pid), "-U", "-n", "--preserve-credentials", "--", topology.BuildPeer(t)}, args...)
	}
}

// tcpCheckIn reports whether the job network reaches inet's address on
// port 9 or gets a refusal from it... it connects to the iperf3-free
// discard port and treats "connection refused" as reachable: the RST came
// from inet.
// lastProbe is the output of the last tcpCheckIn, for messages.
var lastProbe string

func tcpCheckIn(t *testing.T, tp *topology.Topology, peer func(args ...string) []string) bool {
	u := topology.EnsureUser(t)
	argv := peer("tcpcheck", fmt.Sprintf("%s:9", tp.INETAddr))
	_, out, stderr := tp.Run(t, 10*time.Second, tp.CN, u, argv[0], argv[1:]...)
	lastProbe = out + stderr
	return strings.Contains(stderr, "refused")
}

// waitUntil polls ready every 50 ms until it returns true, p exits, or
// timeout passes.
func waitUntil(timeout time.Duration, p *daemon, ready func() bool) error {
	exited, code := false, 0
	if topology.PollEvery(timeout, 50*time.Millisecond, func() bool {
		if p != nil {
			if exited, code = p.exitedCode(); exited {
				return true
			}
		}
		return ready()
	}) {
		if exited {
			return fmt.Errorf("exited %d before ready", code)
		}
		return nil
	}
	return fmt.Errorf("not ready after %v", timeout)
}

// slirpStack is slirp4netns alone: the job is a user+net namespace in cn
// whose only way out is slirp4netns, which opens ordinary sockets in cn;
// cn routes natively through dmz to inet. It is the bare cost of the
// user-space stack of the paper's unprivileged server, on the client side.
type slirpStack struct {
	topo     *topology.Topology
	jobPID   int
	slirpPID int
}

func (s *slirpStack) tp() *topology.Topology      { return s.topo }
func (s *slirpStack) job(argv ...string) []string { return nsJob(s.jobPID, argv...) }
func (s *slirpStack) netnsPID() int               { return s.jobPID }
func (s *slirpStack) check(int64) error           { return nil }
func (s *slirpStack) second(*testing.T, logDir) (func(argv ...string) []string, error) {
	return sameJob(s)
}
func (s *slirpStack) gatewayRoots() []int { return []int{s.slirpPID} }
func (s *slirpStack) clientRoots() []int  { return nil }

// slirpMTU is the MTU slirp4netns gives its tap (Podman's default; the
// slirp4netns default of 1500 is slower).
const slirpMTU = "65520"

func newSlirp(t *testing.T, tp *topology.Topology, logs logDir) (stack, error) {
	u := topology.EnsureUser(t)
	ns := startDaemon(t, tp, logs, "job-ns", tp.CN, u, "", "unshare", "-U", "-r", "-n", "sleep", "100000")
	pid := ns.pid()
	time.Sleep(100 * time.Millisecond)
	sl := startDaemon(t, tp, logs, "slirp4netns", tp.CN, u, "", "slirp4netns", "--configure", "--mtu", slirpMTU, "--disable-host-loopback",
		"--userns-path=/proc/"+strconv.Itoa(pid)+"/ns/user", strconv.Itoa(pid), "tap0")
	s := &slirpStack{topo: tp, jobPID: pid, slirpPID: sl.pid()}
	if err := waitUntil(20*time.Second, sl, func() bool { return tcpCheckIn(t, tp, nsJobPeer(t, pid)) }); err != nil {
		return nil, fmt.Errorf("slirp4netns: %v: %s", err, sl.describe())
	}
	return s, nil
}

// ocserv: the reference stack. ocserv in dmz (as root, kernel forwarding
// and nftables NAT in dmz), or (slirp) as the test user in a user+net
// namespace whose only link is slirp4netns, with the fakeroot shim; the
// client is openconnect --no-dtls (TLS over TCP) with vpnns --attach in cn
// as the test user.
type ocservStack struct {
	topo    *topology.Topology
	gw      []int
	client  int
	home    string // HOME of vpnns (it keeps its state in $HOME/.vpnns-NAME)
	nsPID   int    // vpnns's namespace holder (from vpnns.pid)
	peer    string
	srvAddr string
	pin     string
	dtls    bool
	// udpSeen is the byte count of dmz's UDP counters (ocserv's DTLS
	// port, both ways) at the last check.
	udpSeen int64
}

func (s *ocservStack) tp() *topology.Topology      { return s.topo }
func (s *ocservStack) job(argv ...string) []string { return nsJob(s.nsPID, argv...) }
func (s *ocservStack) netnsPID() int               { return s.nsPID }

// second connects a second vpnns + openconnect session to the same ocserv.
func (s *ocservStack) second(t *testing.T, logs logDir) (func(argv ...string) []string, error) {
	u := topology.EnsureUser(t)
	home := filepath.Join(topology.TempDir(t), "home2")
	if err := os.Mkdir(home, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(home, u.UID, u.GID); err != nil {
		return nil, err
	}
	c, err := connectOpenconnect(t, s.topo, logs, u, home, s.srvAddr, s.pin, s.dtls, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("second openconnect session: %w", err)
	}
	return func(argv ...string) []string { return nsJob(c.nsPID, argv...) }, nil
}

// check fails a DTLS configuration whose data did not go over UDP: the
// UDP bytes through ocserv's port (dmz's nftables counters, both
// directions, DTLS overhead included) must be at least half the bytes
// iperf3 moved, or openconnect has fallen back to TLS over TCP.
func (s *ocservStack) check(bytes int64) error {
	if !s.dtls {
		return nil
	}
	n, err := udpCounter(s.topo)
	if err != nil {
		return fmt.Errorf("DTLS check: %w", err)
	}
	d := n - s.udpSeen
	s.udpSeen = n
	if d*2 < bytes {
		return fmt.Errorf("DTLS FELL BACK TO TCP: %d bytes over UDP port %d for %d bytes of iperf3 data", d, ocPort, bytes)
	}
	return nil
}
func (s *ocservStack) gatewayRoots() []int { return s.gw }
func (s *ocservStack) clientRoots() []int  { return []int{s.client} }

const (
	ocPort     = 4443
	ocUser     = "bench"
	ocPassword = "bench-password"
)

// ocservConfig writes cert, key, password file and config into dir and
// returns the config path and the openconnect pin of the certificate. With
// dtls, ocserv also listens on UDP ocPort for DTLS data channels.
func ocservConfig(dir, network string, dtls bool) (conf, pin string, err error) {
	key, cert := filepath.Join(dir, "key.pem"), filepath.Join(dir, "cert.pem")
	if out, err := exec.Command("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
		"-nodes", "-subj", "/CN=ocserv-bench", "-days", "2", "-keyout", key, "-out", cert).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("openssl req: %v: %s", err, out)
	}
	_ = os.Chmod(key, 0o644)
	b, err := os.ReadFile(cert)
	if err != nil {
		return "", "", err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", "", errors.New("cert.pem: no PEM block")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	pin = "pin-sha256:" + base64.StdEncoding.EncodeToString(sum[:])
	hash, err := exec.Command("openssl", "passwd", "-6", ocPassword).Output()
	if err != nil {
		return "", "", fmt.Errorf("openssl passwd: %v", err)
	}
	passwd := filepath.Join(dir, "ocpasswd")
	if err := os.WriteFile(passwd, []byte(ocUser+":*:"+strings.TrimSpace(string(hash))+"\n"), 0o644); err != nil {
		return "", "", err
	}
	// No udp-port: no DTLS, the data channel is TLS over TCP. The TLS
	// priorities stop at TLS 1.2 and dtls-legacy is on, as ocserv's users
	// configure it for openconnect 9 (with TLS 1.3 openconnect 9.01 does
	// not bring DTLS up); the TCP configuration uses the same priorities.
	udp := ""
	if dtls {
		udp = fmt.Sprintf("udp-port = %d\n", ocPort)
	}
	cfg := fmt.Sprintf(`auth = "plain[passwd=%s]"
tcp-port = %d
%ssocket-file = %s/ocserv.sock
server-cert = %s
server-key = %s
isolate-workers = false
max-clients = 256
max-same-clients = 0
rate-limit-ms = 0
max-ban-score = 0
keepalive = 32400
dpd = 90
mobile-dpd = 1800
try-mtu-discovery = false
tls-priorities = "NORMAL:%%SERVER_PRECEDENCE:%%COMPAT:-VERS-SSL3.0:-VERS-TLS1.3"
dtls-legacy = true
auth-timeout = 240
cookie-timeout = 300
deny-roaming = false
rekey-time = 172800
rekey-method = ssl
use-occtl = false
pid-file = %s/ocserv.pid
log-level = 1
device = vpns
predictable-ips = true
ipv4-network = %s
ipv4-netmask = 255.255.255.0
dns = 203.0.113.2
ping-leases = false
cisco-client-compat = true
`, passwd, ocPort, udp, dir, cert, key, dir, network)
	conf = filepath.Join(dir, "ocserv.conf")
	return conf, pin, os.WriteFile(conf, []byte(cfg), 0o644)
}

// newOcserv sets up the reference stack on tp: ocserv in dmz (as root, or
// with slirp unprivileged behind slirp4netns) and openconnect with vpnns in
// cn; with dtls the data channel is DTLS over UDP (ocserv's udp-port, no
// --no-dtls), else TLS over TCP.
func newOcserv(t *testing.T, tp *topology.Topology, logs logDir, slirp, dtls bool) (stack, error) {
	u := topology.EnsureUser(t)
	dir := topology.TempDir(t)
	s := &ocservStack{topo: tp, peer: topology.BuildPeer(t), srvAddr: fmt.Sprintf("%s:%d", tp.DMZAddrCN, ocPort), dtls: dtls}
	var err error
	var ocservProc *daemon
	if !slirp {
		if ocservProc, s.pin, err = startOcservRoot(t, tp, logs, dir, s.srvAddr, dtls); err != nil {
			return nil, err
		}
		s.gw = []int{ocservProc.pid()}
	} else {
		if s.gw, s.pin, err = startOcservSlirp(t, tp, logs, u, dir); err != nil {
			return nil, err
		}
	}
	s.home = filepath.Join(dir, "home")
	if err := os.Mkdir(s.home, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(s.home, u.UID, u.GID); err != nil {
		return nil, err
	}
	c, err := connectOpenconnect(t, tp, logs, u, s.home, s.srvAddr, s.pin, dtls, 30*time.Second)
	if err != nil {
		if ocservProc != nil {
			err = fmt.Errorf("%w\n--- ocserv ---\n%s", err, ocservProc.describe())
		}
		return nil, err
	}
	s.client, s.nsPID = c.pid, c.nsPID
	return s, nil
}

// startOcservRoot starts ocserv in dmz as root with kernel forwarding and
// masquerade to inet0, listening on srvAddr, and returns it and its pin.
func startOcservRoot(t *testing.T, tp *topology.Topology, logs logDir, dir, srvAddr string, dtls bool) (*daemon, string, error) {
	conf, pin, err := ocservConfig(dir, "10.200.0.0", dtls)
	if err != nil {
		return nil, "", err
	}
	code, _, stderr := tp.Run(t, 10*time.Second, tp.DMZ, nil, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	if code != 0 {
		return nil, "", fmt.Errorf("ip_forward: %s", stderr)
	}
	rules := filepath.Join(dir, "nat.nft")
	if err := os.WriteFile(rules, []byte(natRules("10.200.0.0/24", "inet0")+udpCounterRules(ocPort)), 0o644); err != nil {
		return nil, "", err
	}
	if code, _, stderr := tp.Run(t, 10*time.Second, tp.DMZ, nil, "nft", "-f", rules); code != 0 {
		return nil, "", fmt.Errorf("nft: %s", stderr)
	}
	p := startDaemon(t, tp, logs, "ocserv", tp.DMZ, nil, "", "ocserv", "-f", "-c", conf)
	if err := waitUntil(10*time.Second, p, func() bool { return tp.TCPCheck(t, tp.CN, nil, parseAP(srvAddr)) }); err != nil {
		return nil, "", fmt.Errorf("ocserv: %v: %s", err, p.describe())
	}
	return p, pin, nil
}

// ocproxyStack is the reference system's fallback for nodes without user
// namespaces: ocserv in dmz as for `ocserv`, and in cn openconnect (TLS
// over TCP) with ocproxy as its tun script — an lwIP user-space stack
// serving SOCKS5 on loopback — and iperf3 run under proxychains4, an
// LD_PRELOAD library that sends its TCP connections to that proxy.
type ocproxyStack struct {
	topo   *topology.Topology
	gw     []int
	client int
	conf   string // proxychains4 configuration
}

func (s *ocproxyStack) tp() *topology.Topology { return s.topo }
func (s *ocproxyStack) job(argv ...string) []string {
	return append([]string{"proxychains4", "-q", "-f", s.conf}, argv...)
}
func (s *ocproxyStack) netnsPID() int     { return -1 }
func (s *ocproxyStack) check(int64) error { return nil }
func (s *ocproxyStack) second(*testing.T, logDir) (func(argv ...string) []string, error) {
	return sameJob(s)
}
func (s *ocproxyStack) gatewayRoots() []int { return s.gw }
func (s *ocproxyStack) clientRoots() []int  { return []int{s.client} }

func newOcproxy(t *testing.T, tp *topology.Topology, logs logDir) (stack, error) {
	u := topology.EnsureUser(t)
	dir := topology.TempDir(t)
	srvAddr := fmt.Sprintf("%s:%d", tp.DMZAddrCN, ocPort)
	p, pin, err := startOcservRoot(t, tp, logs, dir, srvAddr, false)
	if err != nil {
		return nil, err
	}
	port := tp.Port()
	conf := filepath.Join(dir, "proxychains.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("strict_chain\nproxy_dns\ntcp_read_time_out 15000\ntcp_connect_time_out 8000\n[ProxyList]\nsocks5 127.0.0.1 %d\n", port)), 0o644); err != nil {
		return nil, err
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(home, u.UID, u.GID); err != nil {
		return nil, err
	}
	oc := startDaemon(t, tp, logs, "openconnect", tp.CN, u, ocPassword+"\n", "env", "HOME="+home, "openconnect", "--non-inter", "--no-dtls",
		"--passwd-on-stdin", "-u", ocUser, "--servercert", pin, "--script-tun",
		"--script", fmt.Sprintf("ocproxy -D %d -k 30", port), "https://"+srvAddr+"/")
	s := &ocproxyStack{topo: tp, gw: []int{p.pid()}, client: oc.pid(), conf: conf}
	// ocproxy listens once openconnect has the tunnel up.
	deadline := time.Now().Add(30 * time.Second)
	for !tp.TCPCheck(t, tp.CN, u, netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port))) {
		if oc.exited() || time.Now().After(deadline) {
			return nil, fmt.Errorf("openconnect with ocproxy: no SOCKS proxy on port %d: %s", port, oc.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s, nil
}

func parseAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// ocClient is one vpnns namespace with openconnect attached to it.
type ocClient struct {
	ns  *daemon // vpnns -- sleep (the namespace holder)
	oc  *daemon // openconnect
	pid int     // openconnect's PID
	// nsPID is the PID vpnns wrote to vpnns.pid, whose namespaces are the
	// job's. Jobs enter them with nsenter rather than a second vpnns --,
	// which races with the watcher and may build a new namespace.
	nsPID int
}

// connectOpenconnect creates the vpnns namespace (vpnns -- sleep), starts
// openconnect with vpnns --attach as its tun script, and waits until a TCP
// connection from inside the namespace reaches inet.
//
// With dtls it leaves DTLS on and waits until openconnect reports the DTLS
// channel established, so that the data goes over UDP.
func connectOpenconnect(t *testing.T, tp *topology.Topology, logs logDir, u *topology.User, home, server, pin string, dtls bool, timeout time.Duration) (*ocClient, error) {
	ns := startDaemon(t, tp, logs, "vpnns", tp.CN, u, "", "env", "HOME="+home, "vpnns", "--", "sleep", "100000")
	pidFile := filepath.Join(home, ".vpnns-default", "vpnns.pid")
	var nsPID int
	if err := waitUntil(10*time.Second, ns, func() bool {
		_, err := os.Stat(filepath.Join(home, ".vpnns-default", "watcher"))
		b, _ := os.ReadFile(pidFile)
		nsPID, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && nsPID > 0
	}); err != nil {
		return nil, fmt.Errorf("vpnns: %v: %s", err, ns.describe())
	}
	// The watcher (nsPID), openconnect's `vpnns --attach` and every
	// `vpnns --` probe leave the daemons' process groups (the watcher
	// daemonizes with setsid): at the end, kill whatever is still in the
	// namespace's network namespace, by PID, or it outlives the run.
	if ino, err := topology.PIDNetnsInode(nsPID); err == nil {
		t.Cleanup(func() { topology.KillNetns(ino) })
	}
	args := []string{"HOME=" + home, "openconnect", "--non-inter", "--no-dtls",
		"--passwd-on-stdin", "-u", ocUser, "--servercert", pin, "--script-tun", "--script", "vpnns --attach", "https://" + server + "/"}
	if *flagFault == "dtls-to-tcp" && dtls {
		// Fault injection, to prove the DTLS check: the client stays on
		// TLS over TCP although the configuration is meant to be DTLS.
		t.Logf("fault dtls-to-tcp: openconnect keeps --no-dtls")
		dtls = false
	}
	if dtls {
		args = slices.DeleteFunc(args, func(a string) bool { return a == "--no-dtls" })
	}
	oc := startDaemon(t, tp, logs, "openconnect", tp.CN, u, ocPassword+"\n", "env", args...)
	c := &ocClient{ns: ns, oc: oc, pid: oc.pid(), nsPID: nsPID}
	peer := nsJobPeer(t, nsPID)
	if err := waitUntil(timeout, ns, func() bool {
		if oc.exited() {
			return false
		}
		return tcpCheckIn(t, tp, peer)
	}); err != nil || oc.exited() {
		return nil, fmt.Errorf("openconnect: %v\n--- last probe ---\n%s\n--- openconnect output ---\n%s", err, lastProbe, oc.output())
	}
	if dtls {
		if err := waitUntil(10*time.Second, ns, func() bool {
			return oc.contains("Established DTLS connection")
		}); err != nil {
			return nil, fmt.Errorf("openconnect: DTLS not established: %v\n--- openconnect output ---\n%s", err, oc.output())
		}
	}
	return c, nil
}

// startOcservSlirp starts ocserv as the test user in a new user+net
// namespace in dmz, connected to dmz only through slirp4netns, with the
// fakeroot shim preloaded; slirp4netns forwards dmz's port ocPort to it.
// It returns the PIDs of ocserv's tree and of slirp4netns, and the pin.
func startOcservSlirp(t *testing.T, tp *topology.Topology, logs logDir, u *topology.User, dir string) ([]int, string, error) {
	if *flagShim == "" {
		return nil, "", errors.New("no fakeroot shim (-bench.shim); run bench/run.sh")
	}
	shim := filepath.Join(dir, "fakeroot.so")
	if b, err := os.ReadFile(*flagShim); err != nil {
		return nil, "", err
	} else if err := os.WriteFile(shim, b, 0o755); err != nil {
		return nil, "", err
	}
	conf, pin, err := ocservConfig(dir, "10.201.0.0", false)
	if err != nil {
		return nil, "", err
	}
	// Inside the namespace (uid 0 = the test user): wait for slirp4netns's
	// tap0, enable forwarding, masquerade the VPN subnet to tap0, exec ocserv.
	script := fmt.Sprintf(`i=0; while ! ip link show tap0 >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 400 ] && exit 3; sleep 0.05; done
echo 1 > /proc/sys/net/ipv4/ip_forward || exit 4
nft -f %s || exit 5
exec env LD_PRELOAD=%s ocserv -f -c %s`, filepath.Join(dir, "nat.nft"), shim, conf)
	if err := os.WriteFile(filepath.Join(dir, "nat.nft"), []byte(natRules("10.201.0.0/24", "tap0")), 0o644); err != nil {
		return nil, "", err
	}
	p := startDaemon(t, tp, logs, "ocserv-userns", tp.DMZ, u, "", "unshare", "-U", "-r", "-n", "sh", "-c", script)
	pid := p.pid()
	time.Sleep(100 * time.Millisecond)
	api := filepath.Join(dir, "slirp.sock")
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, "", err
	}
	sl := startDaemon(t, tp, logs, "slirp4netns", tp.DMZ, u, "", "slirp4netns", "--configure", "--mtu", slirpMTU, "--disable-host-loopback",
		"--api-socket", api, "--userns-path=/proc/"+strconv.Itoa(pid)+"/ns/user", strconv.Itoa(pid), "tap0")
	if err := waitUntil(10*time.Second, sl, func() bool { _, err := os.Stat(api); return err == nil }); err != nil {
		return nil, "", fmt.Errorf("slirp4netns: %v: %s", err, sl.describe())
	}
	req := fmt.Sprintf(`{"execute":"add_hostfwd","arguments":{"proto":"tcp","host_addr":"%s","host_port":%d,"guest_port":%d}}`, tp.DMZAddrCN, ocPort, ocPort)
	if err := slirpAPI(api, req); err != nil {
		return nil, "", fmt.Errorf("slirp4netns add_hostfwd: %v", err)
	}
	if err := waitUntil(15*time.Second, p, func() bool {
		return tp.TCPCheck(t, tp.CN, nil, parseAP(fmt.Sprintf("%s:%d", tp.DMZAddrCN, ocPort)))
	}); err != nil {
		return nil, "", fmt.Errorf("ocserv in userns: %v: %s\n%s", err, p.describe(), sl.describe())
	}
	return []int{pid, sl.pid()}, pin, nil
}

func slirpAPI(sock, req string) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		return err
	}
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	var resp [4096]byte
	n, _ := c.Read(resp[:])
	if strings.Contains(string(resp[:n]), "error") {
		return fmt.Errorf("%s", resp[:n])
	}
	return nil
}

// connectOpenconnectFast is connectOpenconnect for the start-up
// measurement: the namespace's first process is a shell loop that probes
// inet every 5 ms and exits 0 on the first answer, so the caller's clock
// stops when the tunnel first carries a connection.
func connectOpenconnectFast(t *testing.T, tp *topology.Topology, logs logDir, u *topology.User, home, server, pin string) (*ocClient, error) {
	probe := fmt.Sprintf(`i=0; while :; do case "$(%s tcpcheck %s:9 2>&1)" in *refused*) exit 0;; esac; i=$((i+1)); [ $i -gt 4000 ] && exit 1; sleep 0.005; done`,
		topology.BuildPeer(t), tp.INETAddr)
	ns := startDaemon(t, tp, logs, "vpnns-probe", tp.CN, u, "", "env", "HOME="+home, "vpnns", "--", "sh", "-c", probe)
	pidFile := filepath.Join(home, ".vpnns-default", "vpnns.pid")
	for i := 0; ; i++ {
		_, err1 := os.Stat(pidFile)
		_, err2 := os.Stat(filepath.Join(home, ".vpnns-default", "watcher"))
		if err1 == nil && err2 == nil {
			break
		}
		if ok, _ := ns.exitedCode(); ok || i > 5000 {
			return nil, fmt.Errorf("vpnns did not start: %s", ns.describe())
		}
		time.Sleep(2 * time.Millisecond)
	}
	oc := startDaemon(t, tp, logs, "openconnect", tp.CN, u, ocPassword+"\n", "env", "HOME="+home, "openconnect", "--non-inter", "--no-dtls",
		"--passwd-on-stdin", "-u", ocUser, "--servercert", pin, "--script-tun", "--script", "vpnns --attach", "https://"+server+"/")
	code, err := ns.wait(60 * time.Second)
	if err != nil || code != 0 {
		return nil, fmt.Errorf("probe in vpnns: exit %d, %v: %s\n--- openconnect ---\n%s", code, err, ns.describe(), oc.output())
	}
	return &ocClient{ns: ns, oc: oc, pid: oc.pid()}, nil
}

// natRules is an nftables ruleset that masquerades src leaving through oif.
func natRules(src, oif string) string {
	return fmt.Sprintf(`table ip bench {
	chain post {
		type nat hook postrouting priority 100;
		ip saddr %s oifname "%s" masquerade
	}
}
`, src, oif)
}

// udpCounterRules counts, in dmz, the UDP bytes to and from port (a DTLS
// or tunnel port), for udpCounter.
func udpCounterRules(port int) string {
	return fmt.Sprintf(`table ip benchcount {
	counter udpbytes { }
	chain in {
		type filter hook input priority 0;
		udp dport %d counter name "udpbytes"
	}
	chain out {
		type filter hook output priority 0;
		udp sport %d counter name "udpbytes"
	}
}
`, port, port)
}

// udpCounter reads the byte count of udpCounterRules' counter in dmz.
func udpCounter(tp *topology.Topology) (int64, error) {
	cmd := tp.Command(context.Background(), tp.DMZ, nil, "nft", "list", "counter", "ip", "benchcount", "udpbytes")
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("nft list counter: %v", err)
	}
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "bytes" {
			return strconv.ParseInt(f[i+1], 10, 64)
		}
	}
	return 0, fmt.Errorf("nft list counter: no bytes in %q", out)
}
