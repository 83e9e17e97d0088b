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
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	return &ffcli.Command{
		Name:       "gateway",
		ShortUsage: "airlock gateway --state DIR [flags]",
		ShortHelp:  "run the gateway (unprivileged, user-space egress)",
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
			ctx, stop := signalContext()
			defer stop()
			return gateway.Run(ctx, cfg)
		},
	}
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
