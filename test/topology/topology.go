// SPDX-License-Identifier: MIT

// Package topology builds the cn/dmz/inet network-namespace topology that
// Airlock's end-to-end tests and benchmarks run on, and starts real peers
// (iperf3, HTTP, DNS, UDP echo) inside it.
//
// Theory of operation: New creates three named network namespaces with
// unique names, so that tests can run in parallel:
//
//	cn (compute node)          dmz (gateway host)              inet (outside)
//	198.51.100.2 ── veth ── 198.51.100.1   203.0.113.1 ── veth ── 203.0.113.2
//
// cn knows only its link; inet knows only its link; dmz knows both but does
// not forward (ip_forward is 0 in a new namespace), so cn cannot reach inet
// unless something in dmz (the Airlock gateway) re-originates its traffic
// from 203.0.113.1. dmz is two-homed like a real DMZ host: its default
// route leads to the outside (via inet's 203.0.113.2), so 203.0.113.1 is
// the address it would pick for the world, while the gateway listens on
// its inside address 198.51.100.1. WithNativeRouting turns the topology into a plain
// routed path for baseline measurements.
//
// WithSecondDMZ adds a second gateway host, dmz2, linked to cn (cn's dmz2
// 198.51.101.2 ── dmz2's cn0 198.51.101.1) and to inet (dmz2's inet0
// 203.0.114.1 ── inet's dmz2 203.0.114.2), with a route to inet's
// 203.0.113.0/24 through inet, for tests with several gateways.
// WithThirdDMZ adds dmz3 the same way (198.51.102.0/24, 203.0.115.0/24)
// next to dmz2.
//
// WithImpairment puts a fourth namespace, wan, in the middle of the cn–dmz
// link: cn's dmz0 is paired with wan's cn0, wan's dmz0 with dmz's cn0, and
// an impairment relay (airlock-testpeer impair, test/impair) in wan bridges
// the two at layer 2, adding delay, loss, reordering and a rate cap. cn and
// dmz keep their addresses and see one Ethernet segment as before. The
// relay sees single wire packets: transmit checksum offload, TSO, GSO and
// GRO are off on the cn and dmz ends of those links.
//
// Every namespace, process, file and directory a helper creates is removed
// by t.Cleanup, in reverse order of creation, even when the test fails.
// Processes are always stopped by PID (the process group the harness put
// them in, then any PID left in the namespace), never by name.
//
// The helpers need root. Topology is safe for concurrent use by the
// goroutines of one test; its zero value is not usable.
package topology

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/impair"
)

// Fixed addresses of the topology (documentation ranges).
var (
	CNAddr      = netip.MustParseAddr("198.51.100.2")
	DMZAddrCN   = netip.MustParseAddr("198.51.100.1")
	DMZAddrINET = netip.MustParseAddr("203.0.113.1")
	INETAddr    = netip.MustParseAddr("203.0.113.2")

	CNPrefix   = netip.MustParsePrefix("198.51.100.0/24")
	INETPrefix = netip.MustParsePrefix("203.0.113.0/24")

	// The second gateway host's links (WithSecondDMZ).
	CNAddr2      = netip.MustParseAddr("198.51.101.2")
	DMZ2AddrCN   = netip.MustParseAddr("198.51.101.1")
	DMZ2AddrINET = netip.MustParseAddr("203.0.114.1")
	INETAddr2    = netip.MustParseAddr("203.0.114.2")

	// The third gateway host's links (WithThirdDMZ).
	CNAddr3      = netip.MustParseAddr("198.51.102.2")
	DMZ3AddrCN   = netip.MustParseAddr("198.51.102.1")
	DMZ3AddrINET = netip.MustParseAddr("203.0.115.1")
	INETAddr3    = netip.MustParseAddr("203.0.115.2")
)

// Interface names inside the namespaces. Names are per namespace, so they
// are the same in every topology.
const (
	IfCNToDMZ    = "dmz0"  // in cn
	IfDMZToCN    = "cn0"   // in dmz
	IfDMZToINET  = "inet0" // in dmz
	IfINETToDMZ  = "dmz0"  // in inet
	IfWANToCN    = "cn0"   // in wan (WithImpairment)
	IfWANToDMZ   = "dmz0"  // in wan (WithImpairment)
	IfCNToDMZ2   = "dmz2"  // in cn (WithSecondDMZ)
	IfINETToDMZ2 = "dmz2"  // in inet (WithSecondDMZ)
	IfCNToDMZ3   = "dmz3"  // in cn (WithThirdDMZ)
	IfINETToDMZ3 = "dmz3"  // in inet (WithThirdDMZ)
)

// Topology is one cn/dmz/inet instance. Fields are read-only after New.
type Topology struct {
	// CN, DMZ and INET are the network namespace names (for ip netns exec).
	CN, DMZ, INET string
	// WAN is the relay's namespace between cn and dmz; "" without
	// WithImpairment.
	WAN string
	// Impairment is the relay's configuration, with the seed it runs
	// with; nil without WithImpairment.
	Impairment *impair.Config
	// DMZ2 is the second gateway host's namespace; "" without
	// WithSecondDMZ. It has links to cn and inet like dmz (interfaces
	// cn0 and inet0) on addresses of its own (DMZ2AddrCN, DMZ2AddrINET)
	// and a route to INETPrefix through inet, so that a gateway in it
	// reaches the same outside peers. The impairment relay is on dmz's
	// link only.
	DMZ2 string
	// DMZ3 is a third gateway host like DMZ2 (DMZ3AddrCN, DMZ3AddrINET);
	// "" without WithThirdDMZ.
	DMZ3 string
	// Site is the site network's namespace, linked to cn only; "" without
	// WithSite (site.go).
	Site string
	// V4Host and V6Host are the IPv4-only and IPv6-only outside hosts
	// behind inet; "" without WithSingleStackHosts (ipv6.go).
	V4Host, V6Host string
	// CNIPv6Only reports that cn's link to dmz has no IPv4 address
	// (WithIPv6OnlyCN).
	CNIPv6Only bool

	// Addresses on the two links; see the package comment.
	CNAddr, DMZAddrCN, DMZAddrINET, INETAddr netip.Addr

	// Rate is the tc tbf rate on every veth end ("" when uncapped).
	Rate string
	// NativeRouting reports whether cn reaches inet directly through dmz.
	NativeRouting bool

	t        testing.TB
	tun      TUNNode  // /dev/net/tun for commands run as a user
	fuse     FUSENode // /dev/fuse for commands run as a user; "" without WithUserFUSE
	relay    *Process // the impairment relay; nil without WithImpairment
	nextPort atomic.Int32
	extraMu  sync.Mutex
	extra    []netip.Addr // guarded by extraMu: extra inet addresses
}

type options struct {
	dmz2   bool
	dmz3   bool
	site   bool
	uplink bool
	fuse   bool
	rate   string
	native bool
	prefix string
	impair *impair.Config
	cc     string
	// single and cn6only: WithSingleStackHosts, WithIPv6OnlyCN (ipv6.go).
	single, cn6only bool
}

// Option configures New.
type Option func(*options)

// WithRate caps both ends of every veth with a tc tbf qdisc at rate, in tc
// syntax ("1gbit", "100mbit").
func WithRate(rate string) Option { return func(o *options) { o.rate = rate } }

// WithNativeRouting adds routes in cn and inet and enables ip_forward in dmz
// so that cn reaches inet directly: the baseline for benchmarks.
func WithNativeRouting() Option { return func(o *options) { o.native = true } }

// ImpairSeedEnv names an environment variable that, when set, gives the
// seed of every WithImpairment relay whose Config.Seed is 0, to replay a
// run: New logs the seed each relay runs with.
const ImpairSeedEnv = "AIRLOCK_IMPAIR_SEED"

// WithImpairment inserts the impairment relay between cn and dmz (see the
// package comment). c.Up applies to cn → dmz, c.Down to dmz → cn. A zero
// c.Seed means ImpairSeedEnv's value, or a random seed.
func WithImpairment(c impair.Config) Option {
	return func(o *options) { o.impair = &c }
}

// WithCongestionControl sets net.ipv4.tcp_congestion_control to cc in
// every namespace of the topology, for TCP sockets opened there by any
// user. A new network namespace otherwise copies the host's default (the
// initial namespace's), which on this machine is bbr. Outside the initial
// namespace the kernel accepts only algorithms listed in the host's
// net.ipv4.tcp_allowed_congestion_control (here "reno bbr"; not cubic).
// Namespaces made later (a job's) still copy the host's default.
func WithCongestionControl(cc string) Option { return func(o *options) { o.cc = cc } }

// WithSecondDMZ adds a second gateway host, DMZ2 (see Topology.DMZ2), for
// tests with several gateways.
func WithSecondDMZ() Option { return func(o *options) { o.dmz2 = true } }

// WithThirdDMZ adds a second and a third gateway host, DMZ2 and DMZ3 (see
// Topology.DMZ3), for measurements with three gateways.
func WithThirdDMZ() Option { return func(o *options) { o.dmz2, o.dmz3 = true, true } }

// WithPrefix sets the prefix of the namespace names (default "al").
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// New builds a topology and registers its removal with t.Cleanup. It fails
// the test (t.Fatal) on any error, after removing what it had created.
func New(t testing.TB, opts ...Option) *Topology {
	t.Helper()
	RequireRoot(t)
	o := options{prefix: "al"}
	for _, opt := range opts {
		opt(&o)
	}
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatalf("topology: random suffix: %v", err)
	}
	base := fmt.Sprintf("%s%d%s", o.prefix, os.Getpid()%100000, hex.EncodeToString(rnd[:]))
	tp := &Topology{
		CN: base + "-cn", DMZ: base + "-dmz", INET: base + "-inet",
		CNAddr: CNAddr, DMZAddrCN: DMZAddrCN, DMZAddrINET: DMZAddrINET, INETAddr: INETAddr,
		Rate: o.rate, NativeRouting: o.native, CNIPv6Only: o.cn6only,
		t: t,
	}
	tp.tun = NewTUNNode(t, UserTUNMode)
	if o.fuse {
		tp.fuse = NewFUSENode(t, 0o666)
	}
	tp.nextPort.Store(20000)
	nss := []string{tp.CN, tp.DMZ, tp.INET}
	if o.impair != nil {
		tp.WAN = base + "-wan"
		nss = append(nss, tp.WAN)
	}
	if o.dmz2 {
		tp.DMZ2 = base + "-dmz2"
		nss = append(nss, tp.DMZ2)
	}
	if o.dmz3 {
		tp.DMZ3 = base + "-dmz3"
		nss = append(nss, tp.DMZ3)
	}
	if o.site {
		tp.Site = base + "-site"
		nss = append(nss, tp.Site)
	}
	if o.single {
		tp.V4Host, tp.V6Host = base+"-v4h", base+"-v6h"
		nss = append(nss, tp.V4Host, tp.V6Host)
	}

	for _, ns := range nss {
		ns := ns
		mustIP(t, "netns", "add", ns)
		t.Cleanup(func() { tp.removeNamespace(ns) })
		mustIP(t, "-n", ns, "link", "set", "lo", "up")
		if ns == tp.V4Host {
			mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		} else {
			enableIPv6(t, ns) // dual-stack links, no DAD (ipv6.go)
		}
		if o.cc != "" {
			mustRun(t, "ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.tcp_congestion_control="+o.cc)
		}
	}
	// Links are created in one namespace with the peer end moved into the other.
	if tp.WAN == "" {
		mustIP(t, "-n", tp.CN, "link", "add", IfCNToDMZ, "type", "veth", "peer", "name", IfDMZToCN, "netns", tp.DMZ)
	} else {
		mustIP(t, "-n", tp.CN, "link", "add", IfCNToDMZ, "type", "veth", "peer", "name", IfWANToCN, "netns", tp.WAN)
		mustIP(t, "-n", tp.DMZ, "link", "add", IfDMZToCN, "type", "veth", "peer", "name", IfWANToDMZ, "netns", tp.WAN)
		for _, dev := range []string{IfWANToCN, IfWANToDMZ} {
			mustIP(t, "-n", tp.WAN, "link", "set", dev, "up")
		}
		peer := BuildPeer(t)
		mustRun(t, "ip", "netns", "exec", tp.CN, peer, "offloads-off", IfCNToDMZ)
		mustRun(t, "ip", "netns", "exec", tp.DMZ, peer, "offloads-off", IfDMZToCN)
	}
	mustIP(t, "-n", tp.DMZ, "link", "add", IfDMZToINET, "type", "veth", "peer", "name", IfINETToDMZ, "netns", tp.INET)
	addr := func(ns, dev string, a netip.Addr) {
		mustIP(t, "-n", ns, "addr", "add", a.String()+"/24", "dev", dev)
		mustIP(t, "-n", ns, "link", "set", dev, "up")
	}
	if o.cn6only {
		tp.CNAddr = netip.Addr{}
		mustIP(t, "-n", tp.CN, "link", "set", IfCNToDMZ, "up")
	} else {
		addr(tp.CN, IfCNToDMZ, tp.CNAddr)
	}
	addr(tp.DMZ, IfDMZToCN, tp.DMZAddrCN)
	addr(tp.DMZ, IfDMZToINET, tp.DMZAddrINET)
	addr(tp.INET, IfINETToDMZ, tp.INETAddr)
	// The outside is dmz's default route (see the package comment).
	mustIP(t, "-n", tp.DMZ, "route", "add", "default", "via", tp.INETAddr.String())
	links := [][2]string{{tp.CN, IfCNToDMZ}, {tp.DMZ, IfDMZToCN}, {tp.DMZ, IfDMZToINET}, {tp.INET, IfINETToDMZ}}
	// Extra gateway hosts: links to cn and inet, the outside through inet.
	extraDMZ := func(ns, ifCN, ifINET string, cnAddr, dmzCN, dmzINET, inetAddr netip.Addr) {
		mustIP(t, "-n", tp.CN, "link", "add", ifCN, "type", "veth", "peer", "name", IfDMZToCN, "netns", ns)
		mustIP(t, "-n", ns, "link", "add", IfDMZToINET, "type", "veth", "peer", "name", ifINET, "netns", tp.INET)
		addr(tp.CN, ifCN, cnAddr)
		addr(ns, IfDMZToCN, dmzCN)
		addr(ns, IfDMZToINET, dmzINET)
		addr(tp.INET, ifINET, inetAddr)
		mustIP(t, "-n", ns, "route", "add", INETPrefix.String(), "via", inetAddr.String())
		mustIP(t, "-n", ns, "route", "add", "default", "via", inetAddr.String())
		links = append(links, [][2]string{{tp.CN, ifCN}, {ns, IfDMZToCN}, {ns, IfDMZToINET}, {tp.INET, ifINET}}...)
	}
	if tp.DMZ2 != "" {
		extraDMZ(tp.DMZ2, IfCNToDMZ2, IfINETToDMZ2, CNAddr2, DMZ2AddrCN, DMZ2AddrINET, INETAddr2)
	}
	if tp.DMZ3 != "" {
		extraDMZ(tp.DMZ3, IfCNToDMZ3, IfINETToDMZ3, CNAddr3, DMZ3AddrCN, DMZ3AddrINET, INETAddr3)
	}

	if tp.Site != "" {
		links = append(links, tp.linkSite(t)...)
	}
	if o.uplink {
		links = append(links, tp.linkSiteUplink(t)...)
	}
	tp.linkIPv6(t)
	if o.single {
		links = append(links, tp.singleStackHosts(t)...)
	}

	if o.rate != "" {
		burst := tbfBurst(t, o.rate)
		for _, l := range links {
			mustRun(t, "tc", "-n", l[0], "qdisc", "add", "dev", l[1], "root", "tbf",
				"rate", o.rate, "burst", strconv.Itoa(burst), "latency", "20ms")
		}
	}
	if o.impair != nil {
		tp.startRelay(t, *o.impair)
	}
	if o.native {
		mustIP(t, "-n", tp.CN, "route", "add", "default", "via", tp.DMZAddrCN.String())
		mustIP(t, "-n", tp.INET, "route", "add", CNPrefix.String(), "via", tp.DMZAddrINET.String())
		mustRun(t, "ip", "netns", "exec", tp.DMZ, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
		tp.nativeIPv6(t)
	}
	return tp
}

// startRelay starts the impairment relay in wan and waits until its
// sockets are bound.
func (tp *Topology) startRelay(t testing.TB, c impair.Config) {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatalf("topology: WithImpairment: %v", err)
	}
	if c.Seed == 0 {
		if v := os.Getenv(ImpairSeedEnv); v != "" {
			seed, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("topology: %s=%q: %v", ImpairSeedEnv, v, err)
			}
			c.Seed = seed
		} else {
			var b [8]byte
			if _, err := rand.Read(b[:]); err != nil {
				t.Fatalf("topology: impairment seed: %v", err)
			}
			c.Seed = binary.LittleEndian.Uint64(b[:]) >> 1
		}
	}
	tp.Impairment = &c
	cfg, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("topology: impairment config: %v", err)
	}
	t.Logf("topology %s: impairment %s (replay with %s=%d)", tp.WAN, c, ImpairSeedEnv, c.Seed)
	p := tp.Start(t, tp.WAN, nil, BuildPeer(t), "impair", IfWANToCN, IfWANToDMZ, string(cfg))
	tp.waitFor(t, p, 10*time.Second, func() bool { return strings.Contains(p.Stdout(), "ready") })
	tp.relay = p
}

// RelayLog returns the impairment relay's log so far (its periodic
// per-direction counters), or "" without WithImpairment.
func (tp *Topology) RelayLog() string {
	if tp.relay == nil {
		return ""
	}
	return tp.relay.Stderr()
}

// tbfBurst returns a bucket size in bytes for rate: 4 ms worth of data but
// at least 128 KiB, so that a GSO super-packet always fits.
func tbfBurst(t testing.TB, rate string) int {
	r := strings.ToLower(rate)
	mult := map[string]float64{"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1}
	for _, suf := range []string{"gbit", "mbit", "kbit", "bit"} {
		if strings.HasSuffix(r, suf) {
			v, err := strconv.ParseFloat(strings.TrimSuffix(r, suf), 64)
			if err != nil {
				break
			}
			b := int(v * mult[suf] / 8 * 0.004)
			return max(b, 128<<10)
		}
	}
	t.Fatalf("topology: WithRate(%q): want a number with gbit, mbit, kbit or bit", rate)
	return 0
}

// AddINETAddr adds another address from 203.0.113.0/24 to inet's link (for
// tests that need several outside hosts) and returns it.
func (tp *Topology) AddINETAddr(t testing.TB) netip.Addr {
	t.Helper()
	tp.extraMu.Lock()
	defer tp.extraMu.Unlock()
	a := tp.INETAddr
	for i := 0; i <= len(tp.extra); i++ {
		a = a.Next()
	}
	mustIP(t, "-n", tp.INET, "addr", "add", a.String()+"/24", "dev", IfINETToDMZ)
	tp.extra = append(tp.extra, a)
	return a
}

// AddDMZAddrs adds n more addresses from 203.0.113.0/24 (from
// 203.0.113.101 up) to dmz's outside link, for an egress address pool,
// and returns them.
func (tp *Topology) AddDMZAddrs(t testing.TB, n int) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	a := netip.MustParseAddr("203.0.113.101")
	for i := 0; i < n; i++ {
		mustIP(t, "-n", tp.DMZ, "addr", "add", a.String()+"/24", "dev", IfDMZToINET)
		out = append(out, a)
		a = a.Next()
	}
	return out
}

// Port returns a TCP/UDP port number not yet handed out by this topology,
// for a server to listen on.
func (tp *Topology) Port() int { return int(tp.nextPort.Add(1)) }

// Namespaces returns the namespace names: cn, dmz, inet, and wan, dmz2
// and dmz3 if the topology has them.
func (tp *Topology) Namespaces() []string {
	nss := []string{tp.CN, tp.DMZ, tp.INET}
	if tp.WAN != "" {
		nss = append(nss, tp.WAN)
	}
	if tp.DMZ2 != "" {
		nss = append(nss, tp.DMZ2)
	}
	if tp.DMZ3 != "" {
		nss = append(nss, tp.DMZ3)
	}
	if tp.Site != "" {
		nss = append(nss, tp.Site)
	}
	if tp.V4Host != "" {
		nss = append(nss, tp.V4Host, tp.V6Host)
	}
	return nss
}

// NetnsInode returns the inode number identifying the network namespace
// ns, as in readlink /proc/PID/ns/net ("net:[INODE]").
func NetnsInode(ns string) (uint64, error) {
	fi, err := os.Stat(filepath.Join("/var/run/netns", ns))
	if err != nil {
		return 0, err
	}
	return fi.Sys().(*syscall.Stat_t).Ino, nil
}

// PIDNetnsInode returns the inode number of pid's network namespace, as
// NetnsInode does for a named one.
func PIDNetnsInode(pid int) (uint64, error) {
	fi, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return 0, err
	}
	return fi.Sys().(*syscall.Stat_t).Ino, nil
}

// KillNetns sends SIGKILL, by PID, to every process whose network
// namespace has inode ino (NetnsInode, PIDNetnsInode), and scans again
// until a scan finds none (at most 20 scans, 50 ms apart), so processes
// forked meanwhile are caught too. It never signals PID 1 or the caller.
func KillNetns(ino uint64) {
	for attempt := 0; attempt < 20; attempt++ {
		dirs, _ := os.ReadDir("/proc")
		found := 0
		for _, d := range dirs {
			pid, err := strconv.Atoi(d.Name())
			if err != nil || pid <= 1 || pid == os.Getpid() {
				continue
			}
			if got, err := PIDNetnsInode(pid); err == nil && got == ino {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				found++
			}
		}
		if found == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeNamespace kills every process still in ns (by PID), removes ns and
// its /etc/netns directory.
func (tp *Topology) removeNamespace(ns string) {
	if ino, err := NetnsInode(ns); err == nil {
		KillNetns(ino)
	}
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		tp.t.Errorf("topology cleanup: ip netns del %s: %v: %s", ns, err, out)
	}
	_ = os.RemoveAll(filepath.Join("/etc/netns", ns))
}

// SetResolvConf writes /etc/netns/NS/resolv.conf, which ip netns exec
// bind-mounts over /etc/resolv.conf for every command run in ns. It is
// removed at cleanup.
func (tp *Topology) SetResolvConf(ns string, nameservers ...netip.Addr) {
	tp.t.Helper()
	dir := filepath.Join("/etc/netns", ns)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tp.t.Fatalf("SetResolvConf: %v", err)
	}
	tp.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var b strings.Builder
	for _, a := range nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	b.WriteString("options timeout:2 attempts:2\n")
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(b.String()), 0o644); err != nil {
		tp.t.Fatalf("SetResolvConf: %v", err)
	}
}

// Command returns a command that runs name in namespace ns, as u (nil means
// root), killed with its whole process group when ctx is done. Stdout and
// Stderr are left for the caller to set. Commands run as u get HOME=/ and
// working directory /, which every user can read, and a /dev/net/tun of
// mode UserTUNMode (see TUNNode), whatever the host's mode.
func (tp *Topology) Command(ctx context.Context, ns string, u *User, name string, args ...string) *exec.Cmd {
	argv := append([]string{name}, args...)
	if u != nil {
		argv = tp.tun.Command(u, argv...)
		if tp.fuse != "" {
			argv = tp.fuse.Wrap(argv...)
		}
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// ip netns exec, unshare, sh and setpriv exec the target, so the
		// group is the command's.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = 5 * time.Second
	if u != nil {
		cmd.Dir = "/"
		cmd.Env = append(os.Environ(), "HOME=/", "USER="+u.Name, "LOGNAME="+u.Name)
	}
	return cmd
}

// Run runs a command like Command with a timeout and returns its exit code
// (see ExitCode; -1 if the timeout killed it, with a note in stderr),
// stdout and stderr. It does not fail the
// test on a non-zero exit.
func (tp *Topology) Run(t testing.TB, timeout time.Duration, ns string, u *User, name string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := tp.Command(ctx, ns, u, name, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		// Killed by the harness: not the command's own status.
		return -1, o.String(), e.String() + fmt.Sprintf("\n[harness: %s killed after %v timeout]", name, timeout)
	}
	return ExitCode(err), o.String(), e.String()
}

// ExitCode maps the error of exec.Cmd.Run or Wait to an exit code: 0 for
// nil, the status for a normal exit, 128+N for death by signal N, and -1
// otherwise (not started, or Wait failed).
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

// RequireRoot skips the test with a reason when not running as root, unless
// CI is set, in which case it fails: in CI these tests must run.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("namespace tests need root; CI is set, so they must run: run go test as root")
	}
	t.Skip("namespace tests need root (ip netns, veth, setpriv); run as root, or set CI=true to make this a failure")
}

func mustIP(t testing.TB, args ...string) {
	t.Helper()
	mustRun(t, "ip", args...)
}

func mustRun(t testing.TB, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("topology: %s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}
