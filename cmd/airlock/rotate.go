// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
)

// newRotateKeyCmd is `airlock gateway rotate-key`.
func newRotateKeyCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rotate-key [--finish]",
		Short: "replace the gateway's TLS key (the pin) without an outage, in two steps",
		Long: `Rotates the TLS key that clients pin, in two steps, with no outage:

1. airlock gateway rotate-key makes the next key beside the current one.
   The gateway presents the next key to clients that were given its pin
   and the current key to every other client, so nothing breaks; join.env
   now reads AIRLOCK_PIN=NEXT,CURRENT. Hand that line to every node.
2. airlock gateway rotate-key --finish, once no node uses the old pin any
   more (its jobs have ended; airlock_tls_handshakes_total{identity="current"}
   stops growing), makes the next key the only one. Clients that know only
   the old pin fail from then on.

It talks to the running gateway through its admin socket; with the gateway
stopped it changes the state directory, and the gateway uses the keys at
its next start. docs/operations.md has the whole procedure.`,
		Args: noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	finish := cmd.Flags().Bool("finish", false, "end the rotation: the next key becomes the only one")
	asJSON := jsonFlag(cmd, "the pins")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := needState(state); err != nil {
			return err
		}
		var res admin.RotateKeyResult
		c, err := admin.Dial(state)
		switch {
		case err == nil:
			defer c.Close()
			if res, err = c.RotateKey(cmd.Context(), *finish); err != nil {
				return fmt.Errorf("gateway rotate-key: %w", err)
			}
		case errors.Is(err, admin.ErrNoGateway):
			if res, err = rotateOffline(state, *finish); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "airlock: the gateway is not running: it uses the keys at its next start, and rewrites join.env then\n")
		default:
			return fmt.Errorf("gateway rotate-key: %w", err)
		}
		if *asJSON {
			return printJSON(stdout, res)
		}
		fmt.Fprintf(stdout, "AIRLOCK_PIN=%s\n", res.Pin)
		if *finish {
			fmt.Fprintf(stderr, "airlock: rotation finished: the gateway presents only the key of %s\n", res.Current)
		} else {
			fmt.Fprintf(stderr, "airlock: next key %s made; hand the AIRLOCK_PIN line above (also in join.env) to every node, then, when no node uses %s any more, run airlock gateway rotate-key --finish\n", res.Next, res.Current)
		}
		return nil
	}
	return cmd
}

// rotateOffline is a rotation step on the state directory of a stopped
// gateway.
func rotateOffline(state string, finish bool) (admin.RotateKeyResult, error) {
	if finish {
		pin, err := control.FinishRotation(state)
		if err != nil {
			return admin.RotateKeyResult{}, err
		}
		return admin.RotateKeyResult{Pin: pin, Current: pin}, nil
	}
	cur, next, err := control.StartRotation(state)
	if err != nil {
		return admin.RotateKeyResult{}, err
	}
	return admin.RotateKeyResult{Pin: next + "," + cur, Current: cur, Next: next}, nil
}
