package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func newGatewayCmd(stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("airlock gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg gateway.Config
	fs.StringVar(&cfg.StateDir, "state", "", "state directory: keys, certificate, tokens (created 0700)")
	fs.StringVar(&cfg.Listen, "listen", gateway.DefaultListen, "ADDR:PORT for the control API (TCP) and WireGuard (UDP)")
	fs.StringVar(&cfg.Advertise, "advertise", "", "HOST:PORT clients dial (default: derived from --listen)")
	subnet := fs.String("subnet", gateway.DefaultSubnet, "tunnel address subnet; the gateway takes its first address")
	fs.IntVar(&cfg.MTU, "mtu", gateway.DefaultMTU, "tunnel MTU")
	fs.DurationVar(&cfg.RenewInterval, "renew-interval", gateway.DefaultRenewInterval, "how often clients renew their lease")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 0, "how long an unrenewed lease lives (default 3 renew intervals)")
	fs.DurationVar(&cfg.History, "history", gateway.DefaultHistory, "how long ended leases stay in the attribution history (airlock whois)")
	dns := fs.String("dns-upstream", "", "comma-separated IP[:PORT] resolvers for jobs' DNS (default: this host's /etc/resolv.conf)")
	fs.StringVar(&cfg.Egress, "egress", gateway.EgressUser, "egress mode: user (unprivileged, user-space stack) or kernel (root or CAP_NET_ADMIN: kernel TUN, ip_forward, nftables SNAT)")
	egressAddr := fs.String("egress-addr", "", "public IPv4 address jobs' connections leave from (kernel: SNAT target, default the default route's source; user: recorded for whois, default every host address)")
	egressPorts := fs.String("egress-ports", "", "LO-HI source ports split into per-job blocks (user: default and maximum net.ipv4.ip_local_port_range; kernel: default 20000-59999)")
	fs.IntVar(&cfg.BlockSize, "block-size", gateway.DefaultBlockSize, "ports per job block; a job's outside connections use only its block")
	fs.StringVar(&cfg.TUN, "tun", "", "kernel mode: TUN interface name (default airlock0)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	return &ffcli.Command{
		Name:       "gateway",
		ShortUsage: "airlock gateway --state DIR [flags]",
		ShortHelp:  "run the gateway (user-space egress, or kernel egress with --egress kernel)",
		FlagSet:    fs,
		Options:    []ff.Option{ff.WithEnvVarPrefix("AIRLOCK_GATEWAY")},
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("gateway: unexpected arguments %q", args)
			}
			log, err := newLogger(stderr, *logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = log
			if cfg.Subnet, err = netip.ParsePrefix(*subnet); err != nil {
				return fmt.Errorf("bad --subnet: %w", err)
			}
			if cfg.DNSUpstreams, err = parseUpstreams(*dns); err != nil {
				return err
			}
			if err := parseEgress(&cfg, *egressAddr, *egressPorts); err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return gateway.Run(ctx, cfg)
		},
	}
}

// parseEgress checks the egress flags' syntax; gateway.Run checks them
// against the host (port range, default route) before opening any socket.
func parseEgress(cfg *gateway.Config, addr, ports string) error {
	switch cfg.Egress {
	case gateway.EgressUser, gateway.EgressKernel:
	default:
		return fmt.Errorf("bad --egress %q: want %s or %s", cfg.Egress, gateway.EgressUser, gateway.EgressKernel)
	}
	if addr != "" {
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return fmt.Errorf("bad --egress-addr %q: want an IP address", addr)
		}
		cfg.EgressAddr = a
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
