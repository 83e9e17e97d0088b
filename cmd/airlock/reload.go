package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/airlock-vpn/airlock/internal/admin"
)

// newGatewayReloadCmd is `airlock gateway reload`: reload the running
// gateway's config file through its admin socket.
func newGatewayReloadCmd(stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("airlock gateway reload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "", "the gateway's state directory")
	return &ffcli.Command{
		Name:       "reload",
		ShortUsage: "airlock gateway reload --state DIR",
		ShortHelp:  "reload the running gateway's --config file (like SIGHUP); a bad file is refused and the old config stays",
		FlagSet:    fs,
		Exec: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return fmt.Errorf("gateway reload: unexpected arguments %q", args)
			}
			if *state == "" {
				return errors.New("gateway reload: --state DIR is required (the gateway's state directory)")
			}
			c, err := admin.Dial(*state)
			if err != nil {
				if errors.Is(err, admin.ErrNoGateway) {
					return fmt.Errorf("gateway reload: %w: start it, or check --state", err)
				}
				return fmt.Errorf("gateway reload: %w", err)
			}
			defer c.Close()
			res, err := c.Reload(ctx)
			if err != nil {
				return fmt.Errorf("%w (the gateway keeps its old config)", err)
			}
			fmt.Fprintf(stdout, "reloaded %s: %d policy rules (default %s), %d tokens with own limits, %d running jobs re-limited, %d expose rules\n",
				res.File, res.Rules, res.Default, res.TokenLimits, res.Jobs, res.ExposeRules)
			return nil
		},
	}
}

// hangupChannel returns a channel that receives a value on every SIGHUP
// and a function that stops that.
func hangupChannel() (<-chan struct{}, func()) {
	sig := make(chan os.Signal, 1)
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	signal.Notify(sig, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-sig:
				select {
				case out <- struct{}{}:
				default: // a reload is pending already
				}
			}
		}
	}()
	return out, func() { signal.Stop(sig); close(done) }
}
