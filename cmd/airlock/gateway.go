// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
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
	fs.IntVar(&cfg.MTU, "mtu", gateway.DefaultMTU, "tunnel MTU")
	fs.DurationVar(&cfg.RenewInterval, "renew-interval", gateway.DefaultRenewInterval, "how often clients renew their lease")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 0, "how long an unrenewed lease lives (default 3 renew intervals)")
	fs.DurationVar(&cfg.History, "history", 0, "how long ended leases stay in the attribution history (airlock whois) (default 2160h = 90 days; with --store 9600h = 400 days)")
	var so storeOpts
	fs.StringVar(&so.url, "store", "", storeUsage+"; makes this gateway a member of the fleet that shares it (docs/fleet.md)")
	fs.StringVar(&so.passwordFile, "store-password-file", "", storePasswordUsage)
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
	check := fs.Bool("check", false, "check this host for the configured gateway (state directory, listen address, namespaces, /dev/net/tun, ping_group_range, ip_local_port_range vs blocks, RLIMIT_NOFILE), print ok/warn/PROBLEM with fixes, exit 1 on a problem; starts nothing")
	asJSON := jsonFlag(cmd, "the --check report")
	envPrefix(cmd, "AIRLOCK_GATEWAY")
	_ = cmd.MarkFlagFilename("config", "toml")
	enumFlag(cmd, "egress", gateway.EgressUser, gateway.EgressKernel)
	enumFlag(cmd, "tcp-stack", gateway.TCPStackAuto, gateway.TCPStackKernel, gateway.TCPStackNetstack)
	enumFlag(cmd, "log-level", "debug", "info", "warn", "error")
	enumFlag(cmd, "log-format", logFormatText, logFormatJSON)
	enumFlag(cmd, "attest", "off", "munge")
	enumFlag(cmd, "attest-origin", "match", "any")
	_ = cmd.MarkFlagFilename("munge-socket")
	cmd.AddCommand(newGatewayReloadCmd(stdout), newDrainCmd(stdout, stderr), newRotateKeyCmd(stdout, stderr), newBackupCmd(stdout, stderr), newDiagCmd(stdout, stderr))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		log, err := newLoggerFormat(stderr, *logLevel, *logFormat)
		if err != nil {
			return err
		}
		cfg.Logger = log
		cfg.Version = version.Get().Version
		cfg.Store = so.gatewayStore(*storeFailClosed, *storeStale)
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
		hup, stopHup := hangupChannel()
		defer stopHup()
		cfg.Reload = hup
		return gateway.Run(ctx, cfg)
	}
	return cmd
}

// addrFlags are the gateway's address flags of both families: the tunnel
// subnets, where jobs' flows leave from, and (IPv6 alone) the routed
// prefix of jobs' own addresses.
type addrFlags struct {
	subnet, subnet6, egressAddr, egressAddr6, egressPrefix6 string
}

func addAddrFlags(fs *pflag.FlagSet) *addrFlags {
	f := &addrFlags{}
	fs.StringVar(&f.subnet, "subnet", gateway.DefaultSubnet, "tunnel address subnet; the gateway takes its first address")
	fs.StringVar(&f.subnet6, "subnet6", "", "IPv6 tunnel prefix, at most /96; each job's IPv6 address embeds its IPv4 one in the last 32 bits, the gateway's is the one embedding its IPv4 tunnel address (default: a random unique-local /48 made at first start and kept in the state dir; \""+gateway.Subnet6Off+"\": IPv4 only)")
	fs.StringVar(&f.egressAddr, "egress-addr", "", "public IPv4 address(es) jobs' connections leave from and exposed ports listen on: one address, several comma-separated, or a prefix (an egress pool: blocks from every address × --egress-ports) (default: the source address of the default route)")
	fs.StringVar(&f.egressAddr6, "egress-addr6", "", "IPv6 address jobs' IPv6 connections leave from (with their port block) and exposed ports listen on (default: the source address of the IPv6 default route)")
	fs.StringVar(&f.egressPrefix6, "egress-prefix6", "", "a routed IPv6 prefix (at most /96) that gives each job its own public IPv6 address (embedding its IPv4 tunnel address): its IPv6 flows leave from it with any port; user mode needs the prefix routed to this host and a local route (ip -6 route add local PREFIX dev lo), kernel mode routes it")
	return f
}

// parse checks the address flags' syntax and families; gateway.Run checks
// them against the host.
func (f *addrFlags) parse(cfg *gateway.Config) error {
	var err error
	if cfg.Subnet, err = netip.ParsePrefix(f.subnet); err != nil {
		return fmt.Errorf("bad --subnet: %w", err)
	}
	switch f.subnet6 {
	case "":
	case gateway.Subnet6Off:
		cfg.NoIPv6 = true
	default:
		if cfg.Subnet6, err = parsePrefixFlag("--subnet6", f.subnet6, ipfamily.V6, 128); err != nil {
			return err
		}
	}
	if f.egressAddr != "" {
		as, err := portblock.ParseAddrs(f.egressAddr)
		if err != nil {
			return fmt.Errorf("bad --egress-addr %q: %w; want IP addresses or a prefix, comma-separated", f.egressAddr, err)
		}
		cfg.EgressAddr = as[0]
		if len(as) > 1 {
			cfg.EgressAddrs = as
		}
	}
	if f.egressAddr6 != "" {
		cfg.EgressAddr6, err = netip.ParseAddr(f.egressAddr6)
		if err != nil {
			return fmt.Errorf("bad --egress-addr6: %w", err)
		}
		if !ipfamily.V6.Contains(cfg.EgressAddr6) {
			return fmt.Errorf("bad --egress-addr6 %s: want an IPv6 address", f.egressAddr6)
		}
	}
	if f.egressPrefix6 != "" {
		if cfg.EgressPrefix6, err = parsePrefixFlag("--egress-prefix6", f.egressPrefix6, ipfamily.V6, 96); err != nil {
			return err
		}
		if cfg.EgressPrefix6 != cfg.EgressPrefix6.Masked() {
			return fmt.Errorf("bad --egress-prefix6 %s: want the prefix %s", f.egressPrefix6, cfg.EgressPrefix6.Masked())
		}
	}
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
