// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// newGatewayReloadCmd is `airlock gateway reload`: reload the running
// gateway's config file through its admin socket.
func newGatewayReloadCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "reload the running gateway's --config file (like SIGHUP); a bad file is refused and the old config stays",
		Args:  noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	asJSON := jsonFlag(cmd, "what was loaded")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := dialAdmin("gateway reload", state)
		if err != nil {
			return err
		}
		defer c.Close()
		res, err := c.Reload(cmd.Context())
		if err != nil {
			return fmt.Errorf("%w (the gateway keeps its old config)", err)
		}
		if *asJSON {
			return printJSON(stdout, res)
		}
		fmt.Fprintf(stdout, "reloaded %s: %d policy rules (default %s), %d tokens with own limits, %d running jobs re-limited, %d expose rules\n",
			res.File, res.Rules, res.Default, res.TokenLimits, res.Jobs, res.ExposeRules)
		for _, w := range res.Warnings {
			fmt.Fprintf(stdout, "warning: %s\n", human(w))
		}
		return nil
	}
	return cmd
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
