// SPDX-License-Identifier: MIT

// Package e2e holds end-to-end tests of the airlock binary on a real
// cn/dmz/inet namespace topology (test/topology): the gateway runs in dmz,
// unprivileged in user egress mode or as root in kernel egress mode,
// airlock run runs unprivileged in cn, and jobs talk to real iperf3, HTTP,
// DNS and UDP peers in inet. They need root to build the topology; in CI
// (CI set) they run, never skip.
package e2e

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

func TestMain(m *testing.M) { topology.Main(m) }

const (
	// zoneName is the test zone's host name, served by the DNS peer in inet.
	zoneName = "files.airlock.test"
	// gatewayPort is the gateway's control (TCP) and WireGuard (UDP) port.
	gatewayPort = 8443
	bigSize     = 100 << 20
	smallSize   = 1 << 20
	runTimeout  = 90 * time.Second
)

// Names of the env's DNS zone beside zoneName (IPv4 only): one with both
// families, one with inet's IPv6 address only.
const (
	zoneDual = "dual.airlock.test"
	zoneV6   = "v6only.airlock.test"
)

// envZone is the env's DNS zone.
func envZone(tp *topology.Topology) map[string][]netip.Addr {
	return map[string][]netip.Addr{
		zoneName + ".": {tp.INETAddr},
		zoneDual + ".": {tp.INETAddr, topology.INETAddr6},
		zoneV6 + ".":   {topology.INETAddr6},
	}
}

// Egress modes the gateway runs in.
const (
	// modeUser is the default user mode: unprivileged, jobs' IPv4 TCP
	// terminated by the kernel in the gateway's private user namespace.
	modeUser = "user"
	// modeUserNetstack is user mode with --tcp-stack netstack: all of
	// the jobs' traffic terminated by the gVisor netstack.
	modeUserNetstack = "user-netstack"
	modeKernel       = "kernel"
)

// isUserMode reports whether the gateway runs unprivileged in mode.
func isUserMode(mode string) bool { return mode == modeUser || mode == modeUserNetstack }

// env is one topology with peers in inet, a running gateway in dmz and a
// join token. Its methods are safe for concurrent use.
type env struct {
	tp      *topology.Topology
	u       *topology.User
	mode    string         // modeUser, modeUserNetstack or modeKernel
	gwUser  *topology.User // who runs the gateway and admin commands; nil means root
	gwArgs  []string       // airlock gateway's arguments
	airlock string         // path of the airlock binary
	peer    string         // path of airlock-testpeer

	state string // the gateway's state directory
	// tokenStore, if set (by a hook), is the --store URL that tokens are
	// made in, as on a fleet's admin host (a gateway's database role may
	// not make them).
	tokenStore string
	gw         *topology.Process
	gateway    string // HOST:PORT from join.env
	pin        string // sha256:HEX from join.env
	token      string

	httpPort int
	sha      map[string]string // file name → hex sha256
	udpPort  int
	dnsAddr  netip.Addr
}

// newEnv builds the topology, starts the peers and the gateway in user
// mode, waits for join.env and creates a token. Everything is torn down at
// cleanup.
func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvMode(t, modeUser)
}

// newEnvMode is newEnv with the gateway in egress mode: modeUser runs it
// unprivileged as the test user, modeKernel as root with --egress kernel,
// source-NATing to dmz's inet address.
//
// extra arguments are appended to the gateway's.
func newEnvMode(t testing.TB, mode string, extra ...string) *env {
	t.Helper()
	return newEnvTopo(t, mode, nil, extra...)
}

// newEnvTopo is newEnvMode on a topology built with topo (e.g.
// topology.WithImpairment).
func newEnvTopo(t testing.TB, mode string, topo []topology.Option, extra ...string) *env {
	t.Helper()
	return newEnvHook(t, mode, topo, func(*env) []string { return extra })
}

// newEnvHook is newEnvTopo whose extra gateway arguments come from hook,
// called once the peers run (e.g. to name e.httpPort in a flag).
func newEnvHook(t testing.TB, mode string, topo []topology.Option, hook func(*env) []string) *env {
	t.Helper()
	topology.RequireRoot(t)
	e := &env{
		tp:      topology.New(t, topo...),
		u:       topology.EnsureUser(t),
		mode:    mode,
		airlock: topology.BuildAirlock(t),
		peer:    topology.BuildPeer(t),
	}
	e.gwUser = e.u
	if mode == modeKernel {
		e.gwUser = nil
	}
	// As a site admin would for a user-mode gateway: let every group of
	// dmz open ICMP ping sockets, so that jobs' pings are relayed.
	if code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "sysctl", "-q", "-w", `net.ipv4.ping_group_range=0 2147483647`); code != 0 {
		t.Fatalf("sysctl net.ipv4.ping_group_range in dmz: exit %d %s %s", code, out, stderr)
	}
	e.httpPort, e.sha = e.tp.StartHTTP(t, map[string]int64{"big": bigSize, "small": smallSize})
	e.udpPort = e.tp.StartUDPEcho(t)
	e.dnsAddr = e.tp.StartDNSZone(t, e.tp.INET, e.tp.INETAddr, envZone(e.tp))
	e.tp.SetResolvConf(e.tp.DMZ, e.dnsAddr)

	// The state directory's parent is owned by the gateway's user so that
	// the gateway can create the state directory itself (0700).
	base := topology.TempDir(t)
	if e.gwUser != nil {
		if err := os.Chown(base, e.gwUser.UID, e.gwUser.GID); err != nil {
			t.Fatal(err)
		}
	}
	e.state = filepath.Join(base, "state")
	listen := netip.AddrPortFrom(e.tp.DMZAddrCN, gatewayPort).String()
	e.gwArgs = []string{"gateway", "--state", e.state, "--listen", listen}
	// Both modes leave from (and expose ports on) dmz's inet address,
	// which the gateway finds by itself: the source of dmz's default
	// route (no --egress-addr).
	switch mode {
	case modeKernel:
		e.gwArgs = append(e.gwArgs, "--egress", "kernel")
	case modeUserNetstack:
		e.gwArgs = append(e.gwArgs, "--tcp-stack", "netstack")
	}
	extra := hook(e)
	if !hasFlag(extra, "--config") && !hasFlag(extra, "--expose-ports") {
		// Jobs expose nothing unless the admin names the ports; the
		// tests' jobs serve on 8080.
		e.gwArgs = append(e.gwArgs, "--expose-ports", "8080")
	}
	e.gwArgs = append(e.gwArgs, extra...)
	e.startGateway(t)
	// The line in either log format (text, or --log-format json).
	want := fmt.Sprintf("egress_addr=%s from=\"default route\"", e.tp.DMZAddrINET)
	wantJSON := fmt.Sprintf(`"egress_addr":"%s","from":"default route"`, e.tp.DMZAddrINET)
	if log := e.gw.Stderr(); !hasFlag(e.gwArgs, "--egress-addr") && !strings.Contains(log, want) && !strings.Contains(log, wantJSON) {
		t.Errorf("gateway log lacks %q: the egress address must be found from the default route and logged%s", want, e.diag(""))
	}
	if e.gateway != listen {
		t.Errorf("join.env AIRLOCK_GATEWAY = %q, want %q", e.gateway, listen)
	}
	if !strings.HasPrefix(e.pin, "sha256:") || len(e.pin) != len("sha256:")+64 {
		t.Errorf("join.env AIRLOCK_PIN = %q, want sha256:<64 hex digits>", e.pin)
	}
	e.token = e.createToken(t, "e2e")
	return e
}

// hasFlag reports whether args contain flag.
func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || strings.HasPrefix(a, flag+"=") {
			return true
		}
	}
	return false
}

// startGateway starts the gateway (again) on the env's state directory and
// waits until it has written join.env.
func (e *env) startGateway(t testing.TB) {
	t.Helper()
	joinEnv := filepath.Join(e.state, "join.env")
	if err := os.Remove(joinEnv); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	e.gw = e.tp.Start(t, e.tp.DMZ, e.gwUser, e.airlock, e.gwArgs...)
	vals := waitJoinEnv(t, e.gw, e.state, 30*time.Second)
	e.gateway, e.pin = vals["AIRLOCK_GATEWAY"], vals["AIRLOCK_PIN"]
}

// waitJoinEnv waits up to timeout for the gateway gw to write join.env,
// with its address and pin, into its state directory and returns the
// file's values; it fails the test if gw exits first.
func waitJoinEnv(t testing.TB, gw *topology.Process, state string, timeout time.Duration) map[string]string {
	t.Helper()
	joinEnv := filepath.Join(state, "join.env")
	var vals map[string]string
	var err error
	if !topology.Poll(timeout, func() bool {
		vals, err = readEnvFile(joinEnv)
		if err == nil && vals["AIRLOCK_GATEWAY"] != "" && vals["AIRLOCK_PIN"] != "" {
			return true
		}
		ok, _ := gw.Exited()
		return ok
	}) || vals["AIRLOCK_PIN"] == "" {
		t.Fatalf("gateway did not write %s within %v (last error: %v): %s", joinEnv, timeout, err, gw.Describe())
	}
	return vals
}

// readEnvFile parses KEY=VALUE lines.
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vals := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			vals[k] = v
		}
	}
	return vals, sc.Err()
}

// admin runs an airlock admin command (token ..., whois) in dmz as the
// gateway's user.
func (e *env) admin(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return e.tp.Run(t, 30*time.Second, e.tp.DMZ, e.gwUser, e.airlock, args...)
}

func (e *env) createToken(t testing.TB, name string) string {
	t.Helper()
	where := []string{"--state", e.state}
	if e.tokenStore != "" {
		where = []string{"--store", e.tokenStore}
	}
	code, out, stderr := e.admin(t, append(append([]string{"token", "create"}, where...), "--name", name, "--ttl", "1h")...)
	tok := strings.TrimSpace(out)
	if code != 0 || tok == "" || strings.ContainsAny(tok, " \n\t") {
		t.Fatalf("airlock token create --name %s: exit %d, stdout %q (want just the token)%s", name, code, out, e.diag(stderr))
	}
	return tok
}

// diag formats the client's stderr and the tail of the gateway's stderr
// for failure messages.
func (e *env) diag(clientStderr string) string {
	gw := e.gw.Stderr()
	if len(gw) > 4000 {
		gw = "…" + gw[len(gw)-4000:]
	}
	state := "running"
	if ok, code := e.gw.Exited(); ok {
		state = fmt.Sprintf("exited %d", code)
	}
	return fmt.Sprintf("\n--- client stderr ---\n%s\n--- gateway stderr (%s, tail) ---\n%s", clientStderr, state, gw)
}

// runOpts overrides how airlock run is invoked.
type runOpts struct {
	gateway, pin, token string   // "" means the env's value
	viaEnv              bool     // pass them as AIRLOCK_* variables instead of flags
	tokenFile           string   // pass the token as --token-file FILE instead
	env                 []string // extra NAME=VALUE variables for airlock run
	flags               []string // extra airlock run flags (before --)
	timeout             time.Duration
}

func (e *env) command(o runOpts, args ...string) []string {
	gw, pin, tok := e.gateway, e.pin, e.token
	if o.gateway != "" {
		gw = o.gateway
	}
	if o.pin != "" {
		pin = o.pin
	}
	if o.token != "" {
		tok = o.token
	}
	var argv []string
	if o.viaEnv || len(o.env) > 0 {
		argv = append([]string{"env"}, o.env...)
	}
	if o.viaEnv {
		argv = append(argv, "AIRLOCK_GATEWAY="+gw, "AIRLOCK_PIN="+pin, "AIRLOCK_TOKEN="+tok, e.airlock, "run")
		argv = append(append(argv, o.flags...), "--")
		return append(argv, args...)
	}
	if o.tokenFile != "" {
		argv = append(argv, e.airlock, "run", "--gateway", gw, "--pin", pin, "--token-file", o.tokenFile)
		argv = append(append(argv, o.flags...), "--")
		return append(argv, args...)
	}
	argv = append(argv, e.airlock, "run", "--gateway", gw, "--pin", pin, "--token", tok)
	argv = append(append(argv, o.flags...), "--")
	return append(argv, args...)
}

// run runs airlock run -- ARGS as the test user in cn and returns the exit
// code, stdout and stderr.
func (e *env) run(t testing.TB, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return e.runWith(t, runOpts{}, args...)
}

func (e *env) runWith(t testing.TB, o runOpts, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	if o.timeout == 0 {
		o.timeout = runTimeout
	}
	argv := e.command(o, args...)
	return e.tp.Run(t, o.timeout, e.tp.CN, e.u, argv[0], argv[1:]...)
}

// start starts airlock run -- ARGS in the background.
func (e *env) start(t testing.TB, args ...string) *topology.Process {
	t.Helper()
	return e.startWith(t, runOpts{}, args...)
}

// startWith starts airlock run -- ARGS in the background, with options.
func (e *env) startWith(t testing.TB, o runOpts, args ...string) *topology.Process {
	t.Helper()
	argv := e.command(o, args...)
	return e.tp.Start(t, e.tp.CN, e.u, argv[0], argv[1:]...)
}

// mustRun runs airlock run -- ARGS, fails the test unless it exits 0, and
// returns stdout.
func (e *env) mustRun(t testing.TB, args ...string) string {
	t.Helper()
	code, out, stderr := e.run(t, args...)
	if code != 0 {
		t.Fatalf("airlock run -- %s: exit %d, want 0; stdout %q%s", strings.Join(args, " "), code, out, e.diag(stderr))
	}
	return out
}

// snapshot is the test user's processes (pid → "comm (net:[inode])").
type snapshot map[int]string

func (e *env) snapshot() snapshot { return e.u.Processes() }

// checkNoLeftovers fails the test if processes of the test user that were
// not in before are still alive (after a bounded grace period), or if the
// test user's processes are in a network namespace that none of before's
// were in.
func (e *env) checkNoLeftovers(t testing.TB, before snapshot, what string) {
	t.Helper()
	oldNS := map[string]bool{}
	for _, d := range before {
		oldNS[nsOf(d)] = true
	}
	var extra []string
	var newNS map[string]bool
	if !topology.PollEvery(5*time.Second, 100*time.Millisecond, func() bool {
		extra = extra[:0]
		newNS = map[string]bool{}
		for pid, d := range e.snapshot() {
			if _, ok := before[pid]; !ok {
				extra = append(extra, fmt.Sprintf("%d %s", pid, d))
			}
			if ns := nsOf(d); !oldNS[ns] {
				newNS[ns] = true
			}
		}
		return len(extra) == 0 && len(newNS) == 0
	}) {
		sort.Strings(extra)
		t.Errorf("after %s: processes of %s left behind: %v; new network namespaces: %v", what, e.u.Name, extra, keys(newNS))
	}
}

func nsOf(desc string) string {
	if i := strings.LastIndex(desc, "("); i >= 0 {
		return strings.TrimSuffix(desc[i+1:], ")")
	}
	return ""
}

func keys(m map[string]bool) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// netState returns what the hosts' kernels hold for a failed datagram
// flow: the neighbour tables of dmz and inet, dmz's IPv6 routes and, in
// kernel mode, the gateway's nftables table with its counters. It is for
// a failure's message, to tell a lost neighbour from a dropped or
// mistranslated packet.
func (e *env) netState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	show := func(ns string, args ...string) {
		_, out, stderr := e.tp.Run(t, 10*time.Second, ns, nil, args[0], args[1:]...)
		fmt.Fprintf(&b, "\n--- %s: %s ---\n%s%s", ns, strings.Join(args, " "), out, stderr)
	}
	show(e.tp.DMZ, "ip", "neigh", "show")
	show(e.tp.INET, "ip", "neigh", "show")
	show(e.tp.DMZ, "ip", "-6", "route", "show")
	if e.mode == modeKernel {
		show(e.tp.DMZ, "nft", "list", "table", "inet", "airlock")
	}
	return b.String()
}
