// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// newDrainCmd is `airlock gateway drain`.
func newDrainCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "drain [--undo]",
		Short: "refuse new jobs, keep running ones; clients pick another gateway",
		Long: `Tells the running gateway (through its admin socket) to refuse new joins.
Jobs already running keep their leases and connections; the gateway's load
report says it is draining, so clients given several gateways join another.
Draining lasts until --undo or the gateway restarts.`,
		Args: noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	undo := cmd.Flags().Bool("undo", false, "end draining: take new jobs again")
	asJSON := jsonFlag(cmd, "the gateway's answer (draining, jobs)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := dialAdmin("gateway drain", state)
		if err != nil {
			return err
		}
		defer c.Close()
		resp, err := c.Drain(cmd.Context(), !*undo)
		if err != nil {
			return fmt.Errorf("gateway drain: %w", err)
		}
		if *asJSON {
			return printJSON(stdout, resp)
		}
		if resp.Draining {
			fmt.Fprintf(stderr, "airlock: gateway draining: new joins refused, %d running jobs continue\n", resp.Jobs)
		} else {
			fmt.Fprintf(stderr, "airlock: gateway takes new jobs again (%d running)\n", resp.Jobs)
		}
		return nil
	}
	return cmd
}
