package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/airlock-vpn/airlock/internal/admin"
)

func newTokenCmd(stdout, stderr io.Writer) *ffcli.Command {
	stateFlag := func(fs *flag.FlagSet) *string {
		fs.SetOutput(stderr)
		return fs.String("state", "", "the gateway's state directory")
	}

	createFS := flag.NewFlagSet("airlock token create", flag.ContinueOnError)
	createState := stateFlag(createFS)
	name := createFS.String("name", "", "token name, for logs and revocation (default: generated)")
	ttl := createFS.Duration("ttl", 0, "token lifetime, e.g. 720h (default: no expiry)")
	importTok := createFS.Bool("import", false, "store an existing token read from stdin (made by another gateway) instead of a new one, so one token works with several gateways")

	listFS := flag.NewFlagSet("airlock token list", flag.ContinueOnError)
	listState := stateFlag(listFS)

	revokeFS := flag.NewFlagSet("airlock token revoke", flag.ContinueOnError)
	revokeState := stateFlag(revokeFS)

	need := func(state string) error {
		if state == "" {
			return fmt.Errorf("token: --state DIR is required (the gateway's state directory)")
		}
		return nil
	}
	return &ffcli.Command{
		Name:       "token",
		ShortUsage: "airlock token <create|list|revoke> --state DIR [flags]",
		ShortHelp:  "manage join tokens (works while the gateway runs)",
		Subcommands: []*ffcli.Command{
			{
				Name:       "create",
				ShortUsage: "airlock token create --state DIR [--name NAME] [--ttl DURATION] [--import < TOKEN]",
				ShortHelp:  "make a join token and print it on stdout (stored hashed)",
				FlagSet:    createFS,
				Exec: func(ctx context.Context, args []string) error {
					if err := need(*createState); err != nil {
						return err
					}
					if *importTok {
						b, err := io.ReadAll(io.LimitReader(os.Stdin, 4096))
						if err != nil {
							return fmt.Errorf("token create --import: read stdin: %w", err)
						}
						tok, err := admin.ImportToken(ctx, *createState, *name, string(b), *ttl)
						if err != nil {
							return err
						}
						fmt.Fprintf(stderr, "airlock: token %s imported\n", tok.Name)
						return nil
					}
					secret, _, err := admin.CreateToken(ctx, *createState, *name, *ttl)
					if err != nil {
						return err
					}
					fmt.Fprintln(stdout, secret)
					return nil
				},
			},
			{
				Name:       "list",
				ShortUsage: "airlock token list --state DIR",
				ShortHelp:  "list tokens (names and expiry; secrets are never stored)",
				FlagSet:    listFS,
				Exec: func(ctx context.Context, args []string) error {
					if err := need(*listState); err != nil {
						return err
					}
					toks, err := admin.ListTokens(ctx, *listState)
					if err != nil {
						return err
					}
					tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tCREATED\tEXPIRES")
					for _, t := range toks {
						exp := "never"
						if !t.Expires.IsZero() {
							exp = t.Expires.Format(time.RFC3339)
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Name, t.Created.Format(time.RFC3339), exp)
					}
					return tw.Flush()
				},
			},
			{
				Name:       "revoke",
				ShortUsage: "airlock token revoke --state DIR NAME",
				ShortHelp:  "revoke a token by name and end its running jobs' leases",
				FlagSet:    revokeFS,
				Exec: func(ctx context.Context, args []string) error {
					if err := need(*revokeState); err != nil {
						return err
					}
					if len(args) != 1 {
						return fmt.Errorf("token revoke: want one token NAME, got %d arguments", len(args))
					}
					res, err := admin.RevokeToken(ctx, *revokeState, args[0])
					if err != nil {
						return err
					}
					for _, k := range res.Ended {
						fmt.Fprintf(stdout, "ended lease %s of job %s at %s\n", k.Lease, orDash(k.JobID), k.Addr)
					}
					return nil
				},
			},
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
}
