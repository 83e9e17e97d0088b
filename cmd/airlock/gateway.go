// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/envfile"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/sdservice"
	"github.com/airlock-vpn/airlock/internal/version"
)

func newGatewayCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gateway [flags]",
		Short: "run the gateway (user-space egress, or kernel egress with --egress kernel)",
		Long: `Runs the gateway: the control API (TLS) and WireGuard on --listen, the
jobs' egress from --egress-addr with per-job port blocks, the admin socket in
the state directory (created 0700 with the keys and certificate on first
start, when the gateway also writes join.env for the nodes).

Every flag is also read from the environment, as AIRLOCK_GATEWAY_ and the
flag's name in capitals (AIRLOCK_GATEWAY_STATE for --state, which also
falls back to AIRLOCK_STATE), when the command line does not set it.
SIGHUP, like airlock gateway reload, reloads --config.`,
		Example: `  airlock gateway --state /var/lib/airlock --listen 0.0.0.0:8443 --config /etc/airlock/gateway.toml
  airlock gateway --check --json`,
		Args: noArgs,
	}
	fs := cmd.Flags()
	var cfg gateway.Config
	stateFlag(cmd, &cfg.StateDir, "AIRLOCK_GATEWAY_STATE")
	fs.StringVar(&cfg.Listen, "listen", gateway.DefaultListen, "ADDR:PORT for the control API (TCP) and WireGuard (UDP)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "HOST:PORT clients dial (default: derived from --listen)")
	af := addAddrFlags(fs)
	fs.IntVar(&cfg.MTU, "mtu", gateway.DefaultMTU, "tunnel MTU every job starts from: one that every path between nodes and gateway carries")
	fs.IntVar(&cfg.MaxMTU, "max-mtu", 0, "user mode: the largest tunnel MTU offered to a job whose path carries it, proven by the client with a probe before the job starts (falls back to --mtu); 0: derived from the route to each client (its interface's MTU less 60 or 80 bytes, e.g. 8940 on 9000-byte links); the --mtu value offers no more")
	fs.IntVar(&cfg.UDPSockets, "udp-sockets", 0, "UDP sockets per address family sharing the WireGuard port (SO_REUSEPORT), each read by a thread of its own; the kernel keeps each job on one (0: one per core the gateway may use, GOMAXPROCS; at most 64)")
	fs.IntVar(&cfg.TUNQueues, "tun-queues", 0, "queues of the egress TUN (IFF_MULTI_QUEUE: user mode's private namespace with --tcp-stack kernel, kernel mode's), each with a reader of its own; each job's packets take one (0: one per core the gateway may use, GOMAXPROCS; at most 64)")
	fs.DurationVar(&cfg.RenewInterval, "renew-interval", gateway.DefaultRenewInterval, "how often clients renew their lease")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 0, "how long an unrenewed lease lives (default 3 renew intervals)")
	fs.IntVar(&cfg.MaxConnsPerSource, "max-conns-per-source", control.DefaultMaxConnsPerSource, "control connections one source address (or IPv6 /64) may hold open; each running job holds one, so raise it above the jobs behind one NAT address")
	fs.DurationVar(&cfg.History, "history", 0, "how long ended leases stay in the attribution history (airlock whois) (default 2160h = 90 days; with --store 9600h = 400 days)")
	var so storeOpts
	fs.StringVar(&so.url, "store", "", storeUsage+"; makes this gateway a member of the fleet that shares it (docs/fleet.md)")
	fs.StringVar(&so.passwordFile, "store-password-file", "", storePasswordUsage)
	fs.BoolVar(&so.insecure, "store-insecure", false, storeInsecureUsage)
	fleetKey := fs.String("fleet-key", "", "with --store: the fleet key `FILE` (mode 0600, made by airlock db fleet-key, the same on every gateway): enrols this gateway, and jobs are told only of gateways it enrolled (without it, of none: no failover)")
	storeFailClosed := fs.Bool("store-fail-closed", false, "with --store: refuse joins once the local copy of the fleet's tokens and bans is older than --store-stale (default: joins go on with it while the database is down)")
	storeStale := fs.Duration("store-stale", 0, "with --store-fail-closed: how old the local copy may get (default 1m)")
	setEnv(fs.Lookup("store"), "AIRLOCK_GATEWAY_STORE", StoreEnv)
	dns := fs.String("dns-upstream", "", "comma-separated IP[:PORT] resolvers for jobs' DNS (default: this host's /etc/resolv.conf)")
	fs.StringVar(&cfg.Egress, "egress", gateway.EgressUser, "egress mode: user (unprivileged, user-space stack) or kernel (root or CAP_NET_ADMIN: kernel TUN, ip_forward, nftables SNAT)")
	fs.StringVar(&cfg.TCPStack, "tcp-stack", gateway.TCPStackAuto, "user mode: what terminates jobs' TCP (both address families): kernel (the host kernel's TCP in a private user namespace; needs unprivileged user namespaces and /dev/net/tun), netstack (gVisor, user space), or auto (kernel where possible)")
	exposePorts := fs.String("expose-ports", "", "without --config: job ports any job may expose (airlock run --expose), comma-separated PORT[-PORT][/tcp|/udp]; default none")
	egressPorts := fs.String("egress-ports", "", "LO-HI source ports split into per-job blocks (user: default net.ipv4.ip_local_port_range, outside it sockets bind explicitly; kernel: default 20000-59999)")
	fs.IntVar(&cfg.BlockSize, "block-size", gateway.DefaultBlockSize, "ports per job block; a job's outside connections use only its block. It is the base block: a job may ask for more (airlock run --ports, or its token's block_size), up to --max-block-size")
	fs.IntVar(&cfg.MaxBlockSize, "max-block-size", 0, "the most ports one job may ask for (airlock run --ports, a token's block_size), a multiple of --block-size; a job that asks for N gets ⌈N/block-size⌉ consecutive blocks (default 1024 rounded up to whole blocks, at most one address's --egress-ports)")
	fs.StringVar(&cfg.TUN, "tun", "", "kernel mode: TUN interface name (default airlock0)")
	fs.StringVar(&cfg.ConfigFile, "config", "", "config file (TOML, docs/config.md): egress policy, per-token limits, who may expose ports; reloaded on SIGHUP and by airlock gateway reload. Cannot be combined with the limit flags below")
	var lf limitFlags
	// Limit flags: a gateway without --config; with one, its [limits].
	fs.StringVar(&lf.jobEgress, "job-egress-rate", "", "per-job bandwidth job → outside, e.g. 100mbit, 1gbit (default unlimited)")
	fs.StringVar(&lf.jobIngress, "job-ingress-rate", "", "per-job bandwidth outside → job, e.g. 100mbit (default unlimited)")
	fs.StringVar(&lf.egress, "egress-rate", "", "bandwidth of all jobs together, job → outside (default unlimited)")
	fs.StringVar(&lf.ingress, "ingress-rate", "", "bandwidth of all jobs together, outside → job (default unlimited)")
	fs.IntVar(&cfg.Limits.Job.MaxFlows, "job-max-flows", 0, "per-job maximum concurrent flows; more are refused at once (default unlimited)")
	fs.Float64Var(&cfg.Limits.Job.NewFlowsPerSec, "job-new-flows-per-sec", 0, "per-job new flows per second (bursts of the same number); more are refused at once (default unlimited)")
	fs.IntVar(&cfg.Limits.Job.DNSMaxInflight, "job-dns-max-inflight", 0, "per-job DNS queries to the gateway being answered at once; more are answered REFUSED (default 0: 64)")
	fs.Float64Var(&cfg.Limits.Job.DNSQueriesPerSec, "job-dns-queries-per-sec", 0, "per-job DNS queries per second to the gateway (bursts of the same number); more are answered REFUSED (default 0: 100)")
	fs.StringVar(&lf.tokens, "job-limits-tokens", "", "comma-separated token names whose jobs get the --job-* limits (default: every job)")
	flowf := addFlowFlags(fs)
	fs.Func("capture", "write every job's decrypted packets as a pcap stream to this file (created 0600), named pipe or tap:NAME (repeatable; docs/capture.md)", func(s string) error {
		if err := capture.ValidateTo(s); err != nil {
			return err
		}
		cfg.Capture = append(cfg.Capture, s)
		return nil
	})
	fs.StringVar(&cfg.Attest.Mode, "attest", "", "attested identity: munge checks the MUNGE credentials joins carry with this host's munged, takes the uid, gid and node from them and the batch job id from root's credential (the SPANK plugin), and takes attested joins without a token; off (default) takes what jobs say as claimed (docs/security.md). Without --config, or a config without [attest]")
	fs.StringVar(&cfg.Attest.Socket, "munge-socket", "", "with --attest munge: the socket of the gateway's munged, which shares its key with the nodes' (default /run/munge/munge.socket.2; a dedicated node+gateway key has its own munged and socket, docs/security.md)")
	fs.BoolVar(&cfg.Attest.Required, "attest-required", false, "with --attest munge: refuse every join without a valid MUNGE credential (default: only tokens made with --attest require one)")
	attestUIDs := fs.UintSlice("attest-job-uids", nil, "with --attest munge: uids trusted to vouch for batch job ids (default 0: root, as the SPANK plugin in slurmstepd)")
	fs.StringVar(&cfg.Attest.Origin, "attest-origin", "", "with --attest munge: match (default: a join must come from the address its credential's munged gives as origin) or any (nodes behind NAT)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", logFormatText, "log format: text or json (one JSON object per line)")
	envFile := fs.String("env-file", "", "read settings from FILE's AIRLOCK_GATEWAY_<FLAG>=VALUE lines as the packaged service does (/etc/default/airlock-gateway, /etc/sysconfig/airlock-gateway; the file wins over the environment, the command line over both), so that --check checks the service's own settings")
	check := fs.Bool("check", false, "check this host for the configured gateway (state directory, listen address, namespaces, /dev/net/tun, ping_group_range, ip_local_port_range vs blocks, RLIMIT_NOFILE), print ok/warn/PROBLEM with fixes, exit 1 on a problem; starts nothing")
	asJSON := jsonFlag(cmd, "the --check report")
	envPrefix(cmd, "AIRLOCK_GATEWAY")
	_ = cmd.MarkFlagFilename("config", "toml")
	_ = cmd.MarkFlagFilename("env-file")
	enumFlag(cmd, "egress", gateway.EgressUser, gateway.EgressKernel)
	enumFlag(cmd, "tcp-stack", gateway.TCPStackAuto, gateway.TCPStackKernel, gateway.TCPStackNetstack)
	enumFlag(cmd, "log-level", "debug", "info", "warn", "error")
	enumFlag(cmd, "log-format", logFormatText, logFormatJSON)
	enumFlag(cmd, "attest", "off", "munge")
	enumFlag(cmd, "attest-origin", "match", "any")
	_ = cmd.MarkFlagFilename("munge-socket")
	cmd.AddCommand(newGatewayReloadCmd(stdout), newDrainCmd(stdout, stderr), newRotateKeyCmd(stdout, stderr), newBackupCmd(stdout, stderr), newDiagCmd(stdout, stderr))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *envFile != "" {
			if err := applyEnvFile(cmd, *envFile); err != nil {
				return err
			}
		}
		log, err := newLoggerFormat(stderr, *logLevel, *logFormat)
		if err != nil {
			return err
		}
		cfg.Logger = log
		if cmd.Flags().Changed("listen") && cfg.Listen == "" {
			return usagef("--listen is empty: name this host's inside address, the one the nodes reach (AIRLOCK_GATEWAY_LISTEN=10.1.0.5:8443 in /etc/default/airlock-gateway or /etc/sysconfig/airlock-gateway for the packaged service); :8443 listens on every interface")
		}
		cfg.Version = version.Get().Version
		cfg.Store = so.gatewayStore(*storeFailClosed, *storeStale, *fleetKey)
		if err := af.parse(&cfg); err != nil {
			return err
		}
		if err := attestFlags(&cfg, cmd, *attestUIDs); err != nil {
			return err
		}
		if cfg.DNSUpstreams, err = parseUpstreams(*dns); err != nil {
			return err
		}
		if err := parseEgress(&cfg, *egressPorts); err != nil {
			return err
		}
		if cfg.ExposePorts, err = gateway.ParseExposePorts(*exposePorts); err != nil {
			return err
		}
		if err := lf.parse(&cfg.Limits); err != nil {
			return err
		}
		if err := flowf.parse(&cfg); err != nil {
			return err
		}
		if *check {
			return gatewayCheck(cfg, stdout, *asJSON)
		}
		ctx, stop := signalContext()
		defer stop()
		if err := notifySystemd(ctx, &cfg); err != nil {
			return err
		}
		hup, stopHup := hangupChannel()
		defer stopHup()
		cfg.Reload = hup
		return gateway.Run(ctx, cfg)
	}
	return cmd
}

// applyEnvFile sets the flags the command line left alone from path's
// variables, and requires AIRLOCK_GATEWAY_LISTEN there as the packaged
// unit does (its ExecStart has --listen=${AIRLOCK_GATEWAY_LISTEN}).
func applyEnvFile(cmd *cobra.Command, path string) error {
	vars, err := envfile.Read(path)
	if err != nil {
		return err
	}
	if err := applyEnv(cmd, func(k string) string { return vars[k] }); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if !cmd.Flags().Changed("listen") && vars["AIRLOCK_GATEWAY_LISTEN"] == "" {
		return usagef("%s sets no AIRLOCK_GATEWAY_LISTEN: the packaged service refuses to start without it; set it to this host's inside address, the one the nodes reach (e.g. 10.1.0.5:8443)", path)
	}
	return nil
}

// notifySystemd makes the gateway tell systemd (Type=notify, when
// NOTIFY_SOCKET is set) that it is ready, reloading and stopping.
func notifySystemd(ctx context.Context, cfg *gateway.Config) error {
	n, err := sdservice.NewNotifier(os.Getenv)
	if err != nil || !n.Enabled() {
		return err
	}
	log := cfg.Logger
	warn := func(err error) {
		if err != nil {
			log.Warn("cannot notify systemd", "err", err)
		}
	}
	cfg.Ready = func(info gateway.Info) {
		warn(n.Ready("serving jobs at " + info.Advertise))
		go func() {
			<-ctx.Done()
			warn(n.Stopping())
		}()
	}
	cfg.Reloading = func() func() {
		warn(n.Reloading())
		return func() { warn(n.Ready("")) }
	}
	return nil
}

// addrFlags are the gateway's address flags, lists of either family: the
// tunnel subnets, where jobs' flows leave from, and the routed prefix of
// jobs' own addresses. The per-family flags of earlier releases (--subnet6,
// --egress-addr6, --egress-prefix6) are deprecated aliases that add to
// the lists.
type addrFlags struct {
	subnet, egressAddr, egressPrefix string
	// alias holds the deprecated per-family flags: --subnet6,
	// --egress-addr6, --egress-prefix6.
	alias struct{ subnet6, egressAddr6, egressPrefix6 string }
}

// NoIPv6Entry in --subnet turns IPv6 in the tunnel off.
const noIPv6Entry = "no-ipv6"

func addAddrFlags(fs *pflag.FlagSet) *addrFlags {
	f := &addrFlags{}
	fs.StringVar(&f.subnet, "subnet", gateway.DefaultSubnet, "tunnel prefixes, comma-separated, at most one per family; the gateway takes the first address of each. "+
		"With an IPv4 prefix, jobs also get IPv6 unless \""+noIPv6Entry+"\" is listed: the IPv6 prefix listed (at most /96; each job's IPv6 address embeds its IPv4 one in the last 32 bits), "+
		"else a random unique-local /48 made at first start and kept in the state dir. An IPv6 prefix alone makes an IPv6-only tunnel")
	fs.StringVar(&f.egressAddr, "egress-addr", "", "public address(es) jobs' connections leave from and exposed ports listen on, comma-separated, of either family: "+
		"IPv4 one address, several, or a prefix (an egress pool: blocks from every address × --egress-ports); IPv6 one address (jobs' IPv6 flows leave from it with their port block) "+
		"(default: the source address of each family's default route)")
	fs.StringVar(&f.egressPrefix, "egress-prefix", "", "a routed IPv6 prefix (at most /96) that gives each job its own public IPv6 address (embedding its IPv4 tunnel address): its IPv6 flows leave from it with any port; "+
		"user mode needs the prefix routed to this host and a local route (ip -6 route add local PREFIX dev lo), kernel mode routes it")
	fs.StringVar(&f.alias.subnet6, "subnet6", "", "deprecated: list the IPv6 prefix (or "+noIPv6Entry+" for off) in --subnet")
	fs.StringVar(&f.alias.egressAddr6, "egress-addr6", "", "deprecated: list the IPv6 address in --egress-addr")
	fs.StringVar(&f.alias.egressPrefix6, "egress-prefix6", "", "deprecated: use --egress-prefix")
	fs.MarkDeprecated("subnet6", "list the IPv6 prefix (or "+noIPv6Entry+") in --subnet; --subnet6 goes in a later release")
	fs.MarkDeprecated("egress-addr6", "list the IPv6 address in --egress-addr; --egress-addr6 goes in a later release")
	fs.MarkDeprecated("egress-prefix6", "use --egress-prefix; --egress-prefix6 goes in a later release")
	return f
}

// splitList returns the comma-separated entries of s, trimmed, without
// empty ones.
func splitList(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// parse checks the address flags' syntax and families; gateway.Run checks
// them against the host.
func (f *addrFlags) parse(cfg *gateway.Config) error {
	if err := f.parseSubnets(cfg); err != nil {
		return err
	}
	if err := f.parseEgressAddrs(cfg); err != nil {
		return err
	}
	return f.parseEgressPrefix(cfg)
}

// parseSubnets reads --subnet (and the alias --subnet6): an IPv4 prefix,
// an IPv6 one, or both, and no-ipv6.
func (f *addrFlags) parseSubnets(cfg *gateway.Config) error {
	entries := splitList(f.subnet)
	if f.alias.subnet6 == gateway.Subnet6Off {
		entries = append(entries, noIPv6Entry)
	} else if f.alias.subnet6 != "" {
		if _, err := parsePrefixFlag("--subnet6", f.alias.subnet6, ipfamily.V6, 128); err != nil {
			return err
		}
		entries = append(entries, f.alias.subnet6)
	}
	var v4, v6 netip.Prefix
	for _, e := range entries {
		if e == noIPv6Entry {
			cfg.NoIPv6 = true
			continue
		}
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return fmt.Errorf("bad --subnet %q: %w; want prefixes (one IPv4, one IPv6) or %s, comma-separated", e, err, noIPv6Entry)
		}
		if p.Addr().Is4In6() {
			return fmt.Errorf("bad --subnet %s: an IPv4-mapped prefix; write the IPv4 prefix", e)
		}
		at := &v4
		if p.Addr().Is6() {
			at = &v6
		}
		if at.IsValid() && *at != p {
			return fmt.Errorf("bad --subnet: two %s prefixes, %s and %s; want at most one per family", ipfamily.Of(p.Addr()), *at, p)
		}
		*at = p
	}
	if cfg.NoIPv6 && v6.IsValid() {
		return fmt.Errorf("bad --subnet: %s beside %s; want one of them", v6, noIPv6Entry)
	}
	// IPv4 first; an IPv6 prefix alone is an IPv6-only tunnel, the
	// lease manager allocates in it.
	cfg.Subnets = nil
	for _, p := range []netip.Prefix{v4, v6} {
		if p.IsValid() {
			cfg.Subnets = append(cfg.Subnets, p)
		}
	}
	if len(cfg.Subnets) == 0 {
		cfg.Subnets = []netip.Prefix{netip.MustParsePrefix(gateway.DefaultSubnet)}
	}
	return nil
}

// parseEgressAddrs reads --egress-addr (and the alias --egress-addr6):
// IPv4 addresses or a prefix (the egress pool) and at most one IPv6
// address, which is where jobs' IPv6 flows leave from (of an IPv6-only
// tunnel, its egress address). parseSubnets comes first.
func (f *addrFlags) parseEgressAddrs(cfg *gateway.Config) error {
	var v4, v6 []netip.Addr
	for _, e := range splitList(f.egressAddr) {
		as, err := portblock.ParseAddrs(e)
		if err != nil {
			return fmt.Errorf("bad --egress-addr %q: %w; want IP addresses or a prefix, comma-separated", f.egressAddr, err)
		}
		for _, a := range as {
			if a.Is4() {
				v4 = append(v4, a)
			} else {
				v6 = append(v6, a)
			}
		}
	}
	if f.alias.egressAddr6 != "" {
		a, err := netip.ParseAddr(f.alias.egressAddr6)
		if err != nil {
			return fmt.Errorf("bad --egress-addr6: %w", err)
		}
		if !ipfamily.V6.Contains(a) {
			return fmt.Errorf("bad --egress-addr6 %s: want an IPv6 address", f.alias.egressAddr6)
		}
		v6 = append(v6, a)
	}
	if len(v6) > 1 {
		return fmt.Errorf("bad --egress-addr: %d IPv6 addresses; want at most one (an egress pool is of IPv4 addresses)", len(v6))
	}
	switch {
	case len(v6) == 0:
	case cfg.Subnets[0].Addr().Is6():
		// An IPv6-only tunnel: its one egress address.
		if len(v4) > 0 {
			return fmt.Errorf("bad --egress-addr: IPv4 addresses for the IPv6-only tunnel %s; list its IPv6 address alone", cfg.Subnets[0])
		}
	case cfg.NoIPv6:
		return fmt.Errorf("bad --egress-addr %s: an IPv6 address with %s in --subnet", v6[0], noIPv6Entry)
	}
	// IPv4 first: the egress pool (or the one address), then the IPv6
	// address.
	cfg.EgressAddrs = append(v4, v6...)
	return nil
}

// parseEgressPrefix reads --egress-prefix (and the alias
// --egress-prefix6).
func (f *addrFlags) parseEgressPrefix(cfg *gateway.Config) error {
	flag, v := "--egress-prefix", f.egressPrefix
	if f.alias.egressPrefix6 != "" {
		if v != "" && v != f.alias.egressPrefix6 {
			return fmt.Errorf("bad --egress-prefix6 %s beside --egress-prefix %s: want one (--egress-prefix6 is its deprecated alias)", f.alias.egressPrefix6, v)
		}
		flag, v = "--egress-prefix6", f.alias.egressPrefix6
	}
	if v == "" {
		return nil
	}
	p, err := parsePrefixFlag(flag, v, ipfamily.V6, 96)
	if err != nil {
		return fmt.Errorf("%w (jobs' own addresses are IPv6: IPv4 has no room for a prefix per gateway)", err)
	}
	if p != p.Masked() {
		return fmt.Errorf("bad %s %s: want the prefix %s", flag, v, p.Masked())
	}
	cfg.EgressPrefix6 = p
	return nil
}

// parsePrefixFlag parses flag's value s: a prefix of family fam of at most
// maxBits bits.
func parsePrefixFlag(flag, s string, fam *ipfamily.Family, maxBits int) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("bad %s: %w", flag, err)
	}
	if !fam.Contains(p.Addr()) || p.Addr().Is4In6() || p.Bits() > maxBits {
		return netip.Prefix{}, fmt.Errorf("bad %s %s: want an %s prefix of at most /%d", flag, s, fam, maxBits)
	}
	return p, nil
}

// parseEgress checks the egress flags' syntax; gateway.Run checks them
// against the host (port range, default route) before opening any socket.
func parseEgress(cfg *gateway.Config, ports string) error {
	switch cfg.Egress {
	case gateway.EgressUser, gateway.EgressKernel:
	default:
		return fmt.Errorf("bad --egress %q: want %s or %s", cfg.Egress, gateway.EgressUser, gateway.EgressKernel)
	}
	if ports != "" {
		r, err := portblock.ParseRange(ports)
		if err != nil {
			return fmt.Errorf("bad --egress-ports: %w", err)
		}
		cfg.EgressPorts = r
	}
	if cfg.BlockSize < 1 {
		return fmt.Errorf("bad --block-size %d: want at least 1", cfg.BlockSize)
	}
	if cfg.MaxBlockSize < 0 {
		return fmt.Errorf("bad --max-block-size %d: want 0 (the default) or a multiple of --block-size", cfg.MaxBlockSize)
	}
	return nil
}

func parseUpstreams(s string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if ap, err := netip.ParseAddrPort(f); err == nil {
			out = append(out, ap)
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("bad --dns-upstream %q: want IP or IP:PORT", f)
		}
		out = append(out, netip.AddrPortFrom(a, 53))
	}
	return out, nil
}

// limitFlags are the limit flags that need parsing.
type limitFlags struct {
	jobEgress, jobIngress, egress, ingress, tokens string
}

// parse fills in c's rates and tokens and checks the flow limits.
func (f limitFlags) parse(c *gateway.LimitsConfig) error {
	for _, r := range []struct {
		flag, val string
		dst       *uint64
	}{
		{"--job-egress-rate", f.jobEgress, &c.Job.EgressBitsPerSec},
		{"--job-ingress-rate", f.jobIngress, &c.Job.IngressBitsPerSec},
		{"--egress-rate", f.egress, &c.GlobalEgressBitsPerSec},
		{"--ingress-rate", f.ingress, &c.GlobalIngressBitsPerSec},
	} {
		v, err := limits.ParseRate(r.val)
		if err != nil {
			return fmt.Errorf("%s: %w", r.flag, err)
		}
		*r.dst = v
	}
	for _, t := range strings.Split(f.tokens, ",") {
		if t = strings.TrimSpace(t); t != "" {
			c.Tokens = append(c.Tokens, t)
		}
	}
	if err := c.Job.Validate(); err != nil {
		return fmt.Errorf("bad --job-max-flows, --job-new-flows-per-sec or --job-dns-*: %w", err)
	}
	return nil
}

// attestFlags checks the --attest flags into cfg.Attest.
func attestFlags(cfg *gateway.Config, cmd *cobra.Command, uids []uint) error {
	a := &cfg.Attest
	switch a.Mode {
	case "", "off", "munge":
	default:
		return usagef("--attest %q: want munge or off", a.Mode)
	}
	if a.Mode == "off" {
		a.Mode = ""
	}
	switch a.Origin {
	case "", "match", "any":
	default:
		return usagef("--attest-origin %q: want match or any", a.Origin)
	}
	for _, u := range uids {
		if u >= 1<<32-1 {
			return usagef("--attest-job-uids %d: not a uid", u)
		}
		a.JobUIDs = append(a.JobUIDs, uint32(u))
	}
	if a.Mode == "" {
		for _, f := range []string{"munge-socket", "attest-required", "attest-job-uids", "attest-origin"} {
			if cmd.Flags().Changed(f) {
				return usagef("--%s needs --attest munge", f)
			}
		}
	}
	return nil
}
