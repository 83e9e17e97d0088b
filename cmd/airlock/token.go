// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/store"
)

func newTokenCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "manage join tokens (works while the gateway runs)",
		Long: `Join tokens let jobs join the gateway. They are stored hashed in the
state directory; the secret is printed once, by create. Every subcommand
works whether or not the gateway runs (through its admin socket if it does).`,
		Args: noArgs,
		RunE: needSubcommand,
	}
	cmd.AddCommand(newTokenCreateCmd(stdout, stderr), newTokenListCmd(stdout), newTokenRevokeCmd(stdout), newTokenRestrictCmd(stdout))
	return cmd
}

func newTokenCreateCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create [--name NAME] [--ttl DURATION] [--from NETWORK]... [--attest] [--import < TOKEN]",
		Short: "make a join token and print it on stdout (stored hashed)",
		Example: `  airlock token create --name cms-pilots --ttl 720h > cms.token
  airlock token create --name cms-nodes --from 10.1.0.0/16 --attest > nodes.token
  airlock token create --name cms-pilots --import --state /var/lib/airlock-b < cms.token`,
		Args: noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	var so storeOpts
	storeFlags(cmd, &so, "; instead of --state, on an admin host: the fleet's tokens")
	name := cmd.Flags().String("name", "", "token name, for logs and revocation (default: generated)")
	ttl := cmd.Flags().Duration("ttl", 0, "token lifetime, e.g. 720h (default: no expiry)")
	from := cmd.Flags().StringSlice("from", nil, "networks joins with the token may come from, e.g. 10.1.0.0/16 (repeatable; default: anywhere)")
	attestTok := cmd.Flags().Bool("attest", false, "joins with the token must carry a MUNGE credential (a gateway with --attest munge)")
	importTok := cmd.Flags().Bool("import", false, "store an existing token read from stdin (made by another gateway) instead of a new one, so one token works with several gateways")
	asJSON := jsonFlag(cmd, "the token: name, created, expires, and the secret as token")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := needState(state); err != nil {
			return err
		}
		ctx := cmd.Context()
		rs, err := parseRestrictions(*from, *attestTok)
		if err != nil {
			return err
		}
		if *importTok {
			b, err := io.ReadAll(io.LimitReader(os.Stdin, 4096))
			if err != nil {
				return fmt.Errorf("token create --import: read stdin: %w", err)
			}
			tok, err := importToken(ctx, cmd, state, so, *name, string(b), *ttl)
			if err != nil {
				return err
			}
			if tok, err = restrictNew(cmd, state, so, tok, rs); err != nil {
				return err
			}
			if *asJSON {
				return printJSON(stdout, tokenJSON(tok, ""))
			}
			fmt.Fprintf(stderr, "airlock: token %s imported\n", tok.Name)
			return nil
		}
		secret, tok, err := createToken(ctx, cmd, state, so, *name, *ttl)
		if err != nil {
			return err
		}
		if tok, err = restrictNew(cmd, state, so, tok, rs); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, tokenJSON(tok, secret))
		}
		fmt.Fprintln(stdout, secret)
		return nil
	}
	return cmd
}

// tokenOut is a token as token create and token list print it in JSON:
// the store's record without its hash, and the secret (create only).
type tokenOut struct {
	store.Token
	Secret string `json:"token,omitempty"`
}

func tokenJSON(t store.Token, secret string) tokenOut {
	t.Hash = nil
	return tokenOut{Token: t, Secret: secret}
}

func newTokenListCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list",
		Short: "list tokens (names and expiry; secrets are never stored)",
		Args:  noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	var so storeOpts
	storeFlags(cmd, &so, "; instead of --state, on an admin host: the fleet's tokens")
	asJSON := jsonFlag(cmd, "the tokens")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := needState(state); err != nil {
			return err
		}
		toks, err := listTokens(cmd, state, so)
		if err != nil {
			return err
		}
		if *asJSON {
			out := []tokenOut{}
			for _, t := range toks {
				out = append(out, tokenJSON(t, ""))
			}
			return printJSON(stdout, out)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCREATED\tEXPIRES\tFROM\tATTEST")
		for _, t := range toks {
			exp := "never"
			if !t.Expires.IsZero() {
				exp = t.Expires.Format(time.RFC3339)
			}
			from := "anywhere"
			if len(t.From) > 0 {
				from = prefixes(t.From)
			}
			att := "-"
			if t.Attest {
				att = "required"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", orDash(t.Name), t.Created.Format(time.RFC3339), exp, from, att)
		}
		return tw.Flush()
	}
	return cmd
}

func newTokenRevokeCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "revoke NAME",
		Short: "revoke a token by name and end its running jobs' leases",
		Args:  exactArgs(1, "one token NAME"),
	}
	var state string
	stateFlag(cmd, &state)
	var so storeOpts
	storeFlags(cmd, &so, "; instead of --state, on an admin host: the fleet's tokens")
	asJSON := jsonFlag(cmd, "the ended leases")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := needState(state); err != nil {
			return err
		}
		res, err := revokeToken(cmd, state, so, args[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, res)
		}
		for _, k := range res.Ended {
			fmt.Fprintf(stdout, "ended lease %s of job %s at %s\n", k.Lease, orDash(k.JobID), k.Addr)
		}
		return nil
	}
	return cmd
}

func newTokenRestrictCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "restrict NAME [--from NETWORK]... [--attest]",
		Short: "set where a token's joins may come from and whether they need a MUNGE credential",
		Long: `Sets the token's restrictions, replacing the old ones: joins with it are
refused unless they come from one of the --from networks (as the gateway
sees the client's address) and, with --attest, unless they carry a valid
MUNGE credential. Without flags the token is unrestricted again. Running
jobs keep their leases; their next joins meet the new restrictions.`,
		Example: `  airlock token restrict cms-nodes --from 10.1.0.0/16 --from 2001:db8:1::/48
  airlock token restrict cms-nodes --attest`,
		Args: exactArgs(1, "one token NAME"),
	}
	var state string
	stateFlag(cmd, &state)
	var so storeOpts
	storeFlags(cmd, &so, "; instead of --state, on an admin host: the fleet's tokens")
	from := cmd.Flags().StringSlice("from", nil, "networks joins with the token may come from (repeatable; none: anywhere)")
	attestTok := cmd.Flags().Bool("attest", false, "joins with the token must carry a MUNGE credential")
	asJSON := jsonFlag(cmd, "the token")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := needState(state); err != nil {
			return err
		}
		rs, err := parseRestrictions(*from, *attestTok)
		if err != nil {
			return err
		}
		t, err := restrictToken(cmd, state, so, args[0], rs)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, tokenJSON(t, ""))
		}
		from := "anywhere"
		if len(t.From) > 0 {
			from = prefixes(t.From)
		}
		fmt.Fprintf(stdout, "token %s: joins from %s, MUNGE credential required: %v\n", t.Name, from, t.Attest)
		return nil
	}
	return cmd
}

// parseRestrictions parses --from and --attest.
func parseRestrictions(from []string, attest bool) (admin.TokenRestrictions, error) {
	rs := admin.TokenRestrictions{Attest: attest}
	for _, f := range from {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return rs, usagef("--from %q: want a network such as 10.1.0.0/16 or an address", f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p != p.Masked() {
			return rs, usagef("--from %s: host bits set; did you mean %s?", p, p.Masked())
		}
		rs.From = append(rs.From, p)
	}
	return rs, nil
}

// restrictNew sets the restrictions of a token just made, if there are
// any. Its secret has not been printed yet, so no join can come before.
func restrictNew(cmd *cobra.Command, state string, o storeOpts, t store.Token, rs admin.TokenRestrictions) (store.Token, error) {
	if len(rs.From) == 0 && !rs.Attest {
		return t, nil
	}
	return restrictToken(cmd, state, o, t.Name, rs)
}

func prefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
