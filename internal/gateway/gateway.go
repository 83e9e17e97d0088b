// SPDX-License-Identifier: MIT

// Package gateway assembles `airlock gateway`: the state directory and
// identity, the control API, the WireGuard device, the egress backend, the
// lease manager and the admin socket, and runs them until cancelled.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/forward/kernel"
	"github.com/airlock-vpn/airlock/internal/forward/netstack"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/usernet"
)

// Defaults for Config fields left zero.
const (
	DefaultListen        = ":8443"
	DefaultSubnet        = "100.64.0.0/16"
	DefaultMTU           = 1420
	DefaultRenewInterval = 30 * time.Second
	DefaultHistory       = 90 * 24 * time.Hour
	// DefaultFleetHistory is the retention of a fleet's shared history
	// (Store.URL set): an abuse report may come months later.
	DefaultFleetHistory = 400 * 24 * time.Hour
)

// File names inside the state directory.
const (
	WireGuardKeyFile = "wireguard.key"
	JoinEnvFile      = "join.env"
	DBFile           = "airlock.db"
)

// Config configures a gateway. The zero value of every field but Logger and
// StateDir selects its default.
type Config struct {
	Logger   *slog.Logger
	StateDir string
	// Listen is ADDR:PORT for the control API (TCP) and WireGuard (UDP).
	Listen string
	// Advertise is the HOST:PORT clients dial; default derived from Listen.
	Advertise string
	// Subnets are the tunnel prefixes, at most one per family, IPv4
	// first (subnets.go). The first holds the addresses the gateway
	// allocates, and the gateway takes its first host address; an IPv6
	// prefix beside an IPv4 one holds jobs' IPv6 addresses, which embed
	// their IPv4 ones (none listed: the one kept in the state dir, else a
	// random ULA /48, unless NoIPv6); an IPv6 prefix alone makes an
	// IPv6-only tunnel. Empty: DefaultSubnet.
	Subnets []netip.Prefix
	// NoIPv6 turns IPv6 off beside an IPv4 tunnel. EgressPrefix6, if set,
	// is a routed IPv6 prefix that gives each job its own public IPv6
	// address (egress.go).
	NoIPv6        bool
	EgressPrefix6 netip.Prefix
	// MTU is the tunnel MTU every job starts from (DefaultMTU); MaxMTU
	// the largest one user mode offers a client whose path carries it,
	// proven by a probe (mtu.go): 0 derives it from the route to each
	// client, MTU offers no more.
	MTU    int
	MaxMTU int
	// UDPSockets is how many UDP sockets per address family share the
	// WireGuard port (SO_REUSEPORT), each read by a goroutine of its own;
	// TUNQueues how many queues the egress backend's TUN has (the private
	// namespace's in user mode with the kernel's TCP, kernel mode's),
	// each with its own reader. 0 means GOMAXPROCS (the cores the
	// gateway may use), at most MaxParallel; 1 is one socket and one
	// queue, as before both existed (parallel.go).
	UDPSockets int
	TUNQueues  int
	// RenewInterval is how often clients renew; leases expire after
	// LeaseTTL (default three intervals) without renewal.
	RenewInterval time.Duration
	LeaseTTL      time.Duration
	// MaxConnsPerSource bounds the control connections one source (an
	// IPv4 address or an IPv6 /64) holds open: each running job holds
	// one, so a site whose nodes reach the gateway through one NAT
	// address sets it above its jobs (0: control.DefaultMaxConnsPerSource).
	MaxConnsPerSource int
	// History is how long ended leases stay in the attribution history.
	History time.Duration
	// DNSUpstreams override the host's resolvers for jobs' DNS.
	DNSUpstreams []netip.AddrPort
	// Egress is the egress backend: EgressUser ("" too) or EgressKernel.
	Egress string
	// EgressAddrs are the public addresses jobs' flows leave from and
	// their exposed ports listen on (--egress-addr), of either family.
	// Those of the first subnet's family are the egress pool: one
	// address, or several, whose port blocks are drawn from every
	// (address, EgressPorts) pair. Kernel mode source-NATs to them
	// (default: the preferred source of the default route); user mode
	// records them in the lease history (default: unspecified, meaning
	// every address of the host). An IPv6 address beside an IPv4 tunnel
	// (at most one) is where jobs' IPv6 flows leave from, with their port
	// block (default: the source of the IPv6 default route).
	EgressAddrs []netip.Addr
	// EgressPorts is the range split into per-job port blocks; zero means
	// the host's ip_local_port_range in user mode (a wider range is
	// refused) and DefaultKernelPorts in kernel mode.
	EgressPorts portblock.Range
	// BlockSize is the number of ports per job; 0 means DefaultBlockSize.
	// It is the base block: a job may ask for more (blocksize.go).
	BlockSize int
	// MaxBlockSize is the most ports one job may ask for, a multiple of
	// BlockSize; 0 means DefaultMaxBlockSize (rounded to whole blocks).
	MaxBlockSize int
	// TUN names kernel mode's TUN device; "" means kernel.DefaultName.
	TUN string
	// TCPStack chooses what terminates jobs' IPv4 TCP in user mode:
	// TCPStackKernel (the host kernel's TCP in a private user namespace,
	// internal/usernet; fails if that cannot be made), TCPStackAuto (the
	// kernel where it can be made, else the netstack, with a warning) or
	// TCPStackNetstack ("" too: gVisor).
	TCPStack string
	// Limits are the jobs' bandwidth and flow limits from flags; they
	// cannot be combined with ConfigFile.
	Limits LimitsConfig
	// Flows configures the flow table and the flow log (flows.go).
	Flows FlowsConfig
	// Metrics is HOST:PORT of the Prometheus listener; "" means none.
	// A non-loopback address needs MetricsPublic.
	Metrics       string
	MetricsPublic bool
	// Registry, if set, is where the metrics register (tests read it);
	// nil means a fresh registry.
	Registry *prometheus.Registry
	// ExposePorts, without ConfigFile, are the ports jobs of every token
	// may expose (--expose-ports, ParseExposePorts); nil or empty means
	// none. A config file's [[expose]] rules take its place.
	ExposePorts *policy.Exposure
	// ConfigFile, if set, is the config file (package config) with the
	// policy, limits and exposure rules; it is validated before anything
	// is opened and reloaded on Reload and the admin socket's reload.
	ConfigFile string
	// Capture are destinations (file, named pipe or tap:NAME) of
	// capture feeds of every job's packets (--capture), next to the
	// config file's [[capture]] feeds.
	Capture []string
	// Reload, if set, makes the gateway reload ConfigFile on every value
	// received (the command wires it to SIGHUP).
	Reload <-chan struct{}
	// Ready, if set, is called once every listener is open.
	Ready func(Info)
	// Reloading, if set, is called when a reload of ConfigFile starts
	// (SIGHUP or the admin socket's), and the function it returns when
	// that reload has ended, whatever its outcome: systemd's RELOADING=1
	// and READY=1.
	Reloading func() (done func())
	// Store, if its URL is set, makes the gateway a member of a fleet
	// that shares tokens, bans and attribution through PostgreSQL
	// (fleet.go).
	Store StoreConfig
	// Version is the gateway's version, as the fleet's status shows it.
	Version string
	// Attest is attested identity from flags (--attest munge,
	// --munge-socket, --attest-required, --attest-job-uids,
	// --attest-origin); a config file's [attest] takes its place.
	Attest config.Attest
	// Dial, if set, replaces the host's sockets for jobs' outgoing flows.
	// It exists for in-process tests; nil means ordinary sockets.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Info describes a running gateway, as handed to admins in join.env.
type Info struct {
	Advertise   string
	Fingerprint string
	// NextFingerprint is the pin of the next TLS identity while a key
	// rotation is under way (airlock gateway rotate-key), else empty.
	NextFingerprint string
	Control         net.Addr
	UDPPort         uint16
	Gateway         netip.Addr
}

func (c *Config) setDefaults() error {
	if c.Logger == nil {
		return errors.New("gateway: no logger")
	}
	if c.StateDir == "" {
		return errors.New("gateway: no state directory (--state)")
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if err := c.setSubnets(); err != nil {
		return err
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.MTU < 1280 || c.MTU > 65535 {
		return fmt.Errorf("gateway: mtu %d out of range 1280-65535", c.MTU)
	}
	if err := checkMaxMTU(c.MTU, c.MaxMTU); err != nil {
		return err
	}
	if err := c.setParallel(); err != nil {
		return err
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = DefaultRenewInterval
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 3 * c.RenewInterval
	}
	if c.History == 0 {
		c.History = DefaultHistory
		if c.Store.URL != "" {
			c.History = DefaultFleetHistory
		}
	}
	if c.LeaseTTL <= c.RenewInterval {
		return fmt.Errorf("gateway: lease ttl %v must exceed renew interval %v", c.LeaseTTL, c.RenewInterval)
	}
	return nil
}

// TCPStack values.
const (
	TCPStackAuto     = "auto"
	TCPStackKernel   = "kernel"
	TCPStackNetstack = "netstack"
)

// openKernelTCP makes the private namespace for user mode's kernel TCP,
// its TUN of MTU mtu (the largest tunnel MTU offered, mtu.go),
// for jobs of the tunnel subnets of tunnels (both families), if
// cfg.TCPStack asks for it; nil means the netstack terminates TCP. Where
// the namespace cannot carry IPv6 (IPv6 off in the host's kernel), it
// carries IPv4 alone and the netstack keeps jobs' IPv6 TCP.
func openKernelTCP(cfg Config, tunnels []netip.Prefix, mtu int) (*usernet.Namespace, error) {
	switch cfg.TCPStack {
	case "", TCPStackNetstack:
		return nil, nil
	case TCPStackKernel, TCPStackAuto:
	default:
		return nil, fmt.Errorf("bad tcp stack %q: want %s, %s or %s", cfg.TCPStack, TCPStackAuto, TCPStackKernel, TCPStackNetstack)
	}
	var subnets, v4 []netip.Prefix
	for _, p := range tunnels {
		subnets = append(subnets, p.Masked())
		if p.Addr().Is4() {
			v4 = append(v4, p.Masked())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := usernet.Open(ctx, subnets, mtu, cfg.TUNQueues)
	if err != nil && len(v4) > 0 && len(v4) < len(subnets) {
		if ns4, err4 := usernet.Open(ctx, v4, mtu, cfg.TUNQueues); err4 == nil {
			cfg.Logger.Warn("the kernel's TCP terminates jobs' IPv4 only, the user-space netstack their IPv6: the private namespace has no IPv6 here", "err", err)
			cfg.Logger.Debug("private namespace tun queue", "qdisc", ns4.Qdisc)
			return ns4, nil
		}
	}
	if err == nil {
		cfg.Logger.Debug("private namespace tun queue", "qdisc", ns.Qdisc)
		return ns, nil
	}
	if cfg.TCPStack == TCPStackKernel {
		return nil, fmt.Errorf("--tcp-stack kernel: %w; allow unprivileged user namespaces and /dev/net/tun for the gateway user, or use --tcp-stack netstack", err)
	}
	cfg.Logger.Warn("--tcp-stack auto falls back to the user-space netstack for jobs' TCP: the kernel's TCP in a private namespace is not available here "+
		"(the netstack has loss-based congestion control only and costs more CPU per byte); allow unprivileged user namespaces and /dev/net/tun for the gateway user to get it",
		"err", err)
	return nil, nil
}

// newForwarder makes the egress backend of eg.mode on the gateway's tunnel
// addresses tunnels, reporting to flow table tb (and its job index).
func newForwarder(cfg Config, eg egress, tunnels []netip.Prefix, tb *flows.Table, pm *pathMTU) (forward.Backend, error) {
	var egressAddrs []netip.Addr
	for _, a := range append([]netip.Addr{eg.public}, eg.publicOf[:]...) {
		if a.IsValid() && !a.IsUnspecified() {
			egressAddrs = append(egressAddrs, a)
		}
	}
	if eg.mode == EgressKernel {
		if !isHostAddr(eg.public) {
			cfg.Logger.Warn("--egress-addr is not an address of this host; replies to it will not reach the gateway unless the network routes them here", "egress_addr", eg.public)
		}
		f, err := kernel.New(kernel.Config{
			Logger:       cfg.Logger.With("component", "kernel"),
			Name:         cfg.TUN,
			Addrs:        tunnels,
			MTU:          cfg.MTU,
			Queues:       cfg.TUNQueues,
			DNSUpstreams: cfg.DNSUpstreams,
			Egress:       egressAddrs,
			OwnPrefix:    eg.own,
			BlockSize:    eg.plan.Size,
			Flows:        tb,
		})
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	ns := netstack.Config{
		Logger:       cfg.Logger.With("component", "netstack"),
		Addrs:        tunnels,
		Egress:       egressAddrs,
		MTU:          cfg.MTU,
		DNSUpstreams: cfg.DNSUpstreams,
		Dial:         cfg.Dial,
		Flows:        tb,
		// One UDP idle timeout: the flow table's.
		UDPIdleTimeout: cfg.Flows.idle().UDP,
	}
	if !eg.public.IsUnspecified() {
		for _, a := range eg.pool.Addrs {
			if eg.publicFrom == "--egress-addr" && !isHostAddr(a) {
				return nil, fmt.Errorf("--egress-addr %s is not an address of this host: user mode opens jobs' sockets and exposed ports on it", a)
			}
		}
	}
	ns.ExplicitPorts = eg.explicit
	kns, err := openKernelTCP(cfg, tunnels, pm.ceiling)
	if err != nil {
		return nil, fmt.Errorf("user-mode egress: %w", err)
	}
	ns.KernelTCP = kns
	f, err := netstack.New(ns)
	if err != nil {
		return nil, fmt.Errorf("user-mode egress: %w", err)
	}
	return f, nil
}

// ensureStateDir creates dir 0700, or tightens an existing one that others
// can read: it holds private keys.
func ensureStateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("state dir %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		log.Warn("state dir was accessible to others; setting mode 0700", "dir", dir, "mode", fi.Mode().Perm())
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("chmod state dir: %w", err)
		}
	}
	return nil
}
