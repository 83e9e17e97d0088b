// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/statefile"
	"github.com/airlock-vpn/airlock/internal/store"
)

// newBackupCmd is `airlock gateway backup`.
func newBackupCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backup [--output FILE]",
		Short: "back up the state directory (keys, tokens, lease history) while the gateway runs",
		Long: `Writes the gateway's state directory as a gzipped tar: the TLS identity
clients pin (and the next one during a key rotation), the WireGuard key,
the IPv6 tunnel prefix, and a consistent copy of the database (tokens,
live leases, the attribution history, bans) taken while the gateway keeps
running. With the gateway stopped it reads the state directory itself.
The archive holds the keys: keep it as secret as they are (it is created
0600). To restore, stop the gateway, unpack it into an empty state
directory owned by the gateway's user (tar -C DIR -xzf FILE) and start it
(docs/operations.md).`,
		Example: `  airlock gateway backup --output /root/airlock-$(date +%F).tar.gz`,
		Args:    noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	output := cmd.Flags().StringP("output", "o", "", "write the archive to `FILE` (created 0600) instead of stdout")
	_ = cmd.MarkFlagFilename("output", "tar.gz")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := needState(state); err != nil {
			return err
		}
		var out io.Writer = stdout
		if *output != "" && *output != "-" {
			f, err := os.OpenFile(*output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return fmt.Errorf("backup: %w", err)
			}
			defer f.Close()
			out = f
		} else if isTerminal(stdout) {
			return usagef("refusing to write the archive to a terminal: use --output FILE or redirect it")
		}
		return backupState(cmd.Context(), stderr, out, state)
	}
	return cmd
}

// backupState writes the archive of state directory state to out: from
// the running gateway, or, if none runs, from the directory itself.
func backupState(ctx context.Context, stderr, out io.Writer, state string) error {
	c, err := admin.Dial(state)
	switch {
	case err == nil:
		defer c.Close()
		n, err := c.Backup(ctx, out)
		if err != nil {
			return fmt.Errorf("gateway backup: %w", err)
		}
		fmt.Fprintf(stderr, "airlock: backed up the running gateway's state (%d bytes)\n", n)
	case errors.Is(err, admin.ErrNoGateway):
		path := filepath.Join(state, store.FileName)
		if ok, err := statefile.Exists(path); err != nil || !ok {
			return fmt.Errorf("gateway backup: no state database in %s (%v): is it the gateway's --state directory?", state, err)
		}
		db, err := store.Open(path, 5*time.Second)
		if err != nil {
			return fmt.Errorf("gateway backup: %w", err)
		}
		defer db.Close()
		if err := admin.WriteBackup(out, state, gateway.BackupFiles(), db); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "airlock: backed up %s (the gateway is not running)\n", state)
	default:
		return fmt.Errorf("gateway backup: %w", err)
	}
	return nil
}
