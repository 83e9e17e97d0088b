package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/airlock-vpn/airlock/internal/admin"
)

// newDrainCmd is `airlock gateway drain`.
func newDrainCmd(stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("airlock gateway drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "", "the gateway's state directory")
	undo := fs.Bool("undo", false, "end draining: take new jobs again")
	return &ffcli.Command{
		Name:       "drain",
		ShortUsage: "airlock gateway drain --state DIR [--undo]",
		ShortHelp:  "refuse new jobs, keep running ones; clients pick another gateway",
		LongHelp: `Tells the running gateway (through its admin socket) to refuse new joins.
Jobs already running keep their leases and connections; the gateway's load
report says it is draining, so clients given several gateways join another.
Draining lasts until --undo or the gateway restarts.`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			if *state == "" {
				return errors.New("gateway drain: --state DIR is required (the gateway's state directory)")
			}
			if len(args) > 0 {
				return fmt.Errorf("gateway drain: unexpected arguments %q", args)
			}
			c, err := admin.Dial(*state)
			if err != nil {
				if errors.Is(err, admin.ErrNoGateway) {
					return fmt.Errorf("gateway drain: %w: is the gateway running with --state %s?", err, *state)
				}
				return err
			}
			defer c.Close()
			resp, err := c.Drain(ctx, !*undo)
			if err != nil {
				return fmt.Errorf("gateway drain: %w", err)
			}
			if resp.Draining {
				fmt.Fprintf(stderr, "airlock: gateway draining: new joins refused, %d running jobs continue\n", resp.Jobs)
			} else {
				fmt.Fprintf(stderr, "airlock: gateway takes new jobs again (%d running)\n", resp.Jobs)
			}
			return nil
		},
	}
}
