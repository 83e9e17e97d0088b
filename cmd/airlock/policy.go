// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// newPolicyCmd is `airlock policy`: the gateway's policy, read from its
// config file, as the admin checks it before deploying.
func newPolicyCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "check the gateway's egress policy from its config file",
		Args:  noArgs,
		RunE:  needSubcommand,
	}
	cmd.AddCommand(newPolicyExplainCmd(stdout, stderr))
	return cmd
}

func newPolicyExplainCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "explain --config FILE [--token NAME] [--proto P] DEST:PORT|DEST...",
		Short: "say which rule of a config file decides a flow, and why",
		Long: `Reads the gateway's config file as the gateway would (no gateway need run)
and says, for a new flow of a job that joined with the token named --token
to each DEST:PORT ([IPV6]:PORT; a bare address with --proto icmp), whether
the policy allows it, which rule decides, on which line, and why each rule
before it did not. A host name is resolved here, and each of its addresses
explained. The gateway host's own addresses and tunnel subnets are not in
the file: the gateway denies those (builtin-host, builtin-floor) whatever
this says.

The file's [[policy.test]] entries are run as well; when one fails, the
gateway would refuse the file, and explain says so on stderr (and exits 1)
after explaining.`,
		Example: `  airlock policy explain --config /etc/airlock/gateway.toml --token cms-pilots 10.20.1.5:1094
  airlock policy explain --config gateway.toml --proto icmp 198.51.100.7`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("want at least one DEST:PORT")
			}
			return nil
		},
	}
	path := cmd.Flags().String("config", "", "the gateway's config `FILE` (TOML, docs/config.md)")
	setEnv(cmd.Flags().Lookup("config"), "AIRLOCK_GATEWAY_CONFIG")
	_ = cmd.MarkFlagFilename("config", "toml")
	token := cmd.Flags().String("token", "", "the name of the token the job joined with (default: a token no rule names)")
	protoName := cmd.Flags().String("proto", "tcp", "the flow's protocol: tcp, udp or icmp")
	enumFlag(cmd, "proto", "tcp", "udp", "icmp")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return explainPolicy(cmd.Context(), stdout, stderr, *path, *token, *protoName, args)
	}
	return cmd
}

// explainPolicy explains, by the config file at path, a new flow of a job
// of token to each destination of args by protocol protoName, then says
// on stderr (and fails) if the gateway would refuse the file.
func explainPolicy(ctx context.Context, stdout, stderr io.Writer, path, token, protoName string, args []string) error {
	if path == "" {
		return usagef("--config is empty: want the gateway's config file (as its --config)")
	}
	proto, err := policy.ParseProto(protoName)
	if err != nil || proto == policy.ProtoAny {
		return usagef("bad --proto %q: want tcp, udp or icmp", truncateArg(protoName))
	}
	cfg, err := config.LoadUntested(path)
	if err != nil {
		return err
	}
	for _, arg := range args {
		dsts, err := explainDests(ctx, arg, proto)
		if err != nil {
			return err
		}
		for _, ap := range dsts {
			f := policy.Flow{Token: token, Proto: proto, Dst: ap.Addr(), Port: ap.Port()}
			printExplanation(stdout, cfg, f, cfg.Policy.Explain(f))
		}
	}
	if _, err := config.Load(path); err != nil {
		fmt.Fprintf(stderr, "airlock: the gateway would refuse %s: %v\n", path, err)
		return exitError{exitFailure}
	}
	return nil
}

// explainDests parses DEST:PORT (or DEST for icmp), resolving a name.
func explainDests(ctx context.Context, arg string, proto policy.Proto) ([]netip.AddrPort, error) {
	host, port := arg, uint16(0)
	if proto != policy.ProtoICMP {
		h, p, err := net.SplitHostPort(arg)
		n, perr := strconv.ParseUint(p, 10, 16)
		if err != nil || perr != nil || n == 0 {
			return nil, usagef("bad destination %q: want HOST:PORT or [IPV6]:PORT with a port from 1 to 65535", truncateArg(arg))
		}
		host, port = h, uint16(n)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.AddrPort{netip.AddrPortFrom(a, port)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			return nil, fmt.Errorf("resolve %q: no such host; give an address", truncateArg(host))
		}
		return nil, fmt.Errorf("resolve %q: %w", truncateArg(host), err)
	}
	out := make([]netip.AddrPort, len(addrs))
	for i, a := range addrs {
		out[i] = netip.AddrPortFrom(a.Unmap(), port)
	}
	return out, nil
}

// printExplanation prints one flow's verdict and the steps to it.
func printExplanation(w io.Writer, cfg *config.Config, f policy.Flow, e policy.Explanation) {
	dst := f.Dst.String()
	if f.Proto != policy.ProtoICMP {
		dst = netip.AddrPortFrom(f.Dst, f.Port).String()
	}
	tok := "a token no rule names"
	if f.Token != "" {
		tok = fmt.Sprintf("token %q", f.Token)
	}
	by := "the built-in rule " + e.Verdict.Rule
	switch {
	case e.Index >= 0:
		by = fmt.Sprintf("rule %q (%s:%d, policy.rule[%d])", e.Verdict.Rule, cfg.Path, cfg.RuleLine(e.Index), e.Index+1)
	case e.Verdict.Rule == policy.RuleDefault:
		by = "the default"
	}
	fmt.Fprintf(w, "%s %s for %s: %s by %s\n", f.Proto, dst, tok, e.Verdict.Action, by)
	for _, s := range e.Steps {
		fmt.Fprintf(w, "  %s\n", s)
	}
}
