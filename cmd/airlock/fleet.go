// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

// The fleet's commands and flags (docs/fleet.md): a gateway joins a fleet
// with --store postgres://…; an admin host that reaches only the database
// runs token, whois, status --fleet and kick with --store instead of
// --state; airlock db migrate applies the schema.

// StoreEnv is the environment variable that --store defaults to.
const StoreEnv = "AIRLOCK_STORE"

// storeOpts are the shared database's flags.
type storeOpts struct {
	url, passwordFile string
}

// storeUsage is --store's help.
const storeUsage = "the fleet's shared PostgreSQL database `URL`, postgres://USER@HOST/DB?sslmode=verify-full&sslrootcert=CA; the password from --store-password-file, PGPASSWORD or PGPASSFILE, never in the URL"

// storePasswordUsage is --store-password-file's help.
const storePasswordUsage = "`FILE` (mode 0600) whose first line is the database password"

func (o storeOpts) config() pgstore.Config {
	return pgstore.Config{URL: o.url, PasswordFile: o.passwordFile}
}

// set reports whether a database was given.
func (o storeOpts) set() bool { return o.url != "" }

// open connects to the database as an admin command does.
func (o storeOpts) open(ctx context.Context) (*pgstore.Store, error) {
	return pgstore.Open(ctx, o.config())
}

// gatewayStore is the gateway's StoreConfig from its flags.
func (o storeOpts) gatewayStore(failClosed bool, stale time.Duration) gateway.StoreConfig {
	return gateway.StoreConfig{URL: o.url, PasswordFile: o.passwordFile, FailClosed: failClosed, Stale: stale}
}

// runDBMigrate is airlock db migrate.
func runDBMigrate(ctx context.Context, w io.Writer, o storeOpts) error {
	if !o.set() {
		return usagef("db migrate: --store URL (or %s) is required", StoreEnv)
	}
	from, to, err := pgstore.Migrate(ctx, o.config())
	if err != nil {
		return err
	}
	if from == to {
		fmt.Fprintf(w, "schema version %d: up to date\n", to)
		return nil
	}
	fmt.Fprintf(w, "schema version %d → %d\n", from, to)
	return nil
}

// withStoreDB runs fn on the database given by o.
func withStoreDB(ctx context.Context, o storeOpts, fn func(*pgstore.Store) error) error {
	db, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	return fn(db)
}

// fleetStatus returns the fleet's status through the gateway of state, or
// from the database o.
func fleetStatus(ctx context.Context, state string, o storeOpts) (fleet.Status, error) {
	var st fleet.Status
	if o.set() {
		err := withStoreDB(ctx, o, func(db *pgstore.Store) error {
			var err error
			st, err = fleet.FleetStatus(db)
			return err
		})
		return st, err
	}
	c, err := dialAdmin("status --fleet", state)
	if err != nil {
		return st, err
	}
	defer c.Close()
	err = c.Do(ctx, "GET", admin.FleetPath, nil, &st)
	return st, err
}

// printFleetStatus prints every gateway, then every live job of the fleet.
func printFleetStatus(w io.Writer, st fleet.Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GATEWAY\tSTATE\tJOBS\tCAPACITY\tVERSION\tHEARTBEAT\tMEMBER\tPIN")
	jobs := 0
	for _, m := range st.Members {
		state := "up"
		switch {
		case m.Stopped:
			state = "stopped"
		case !m.Alive:
			state = "LOST"
		case m.Draining:
			state = "draining"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s ago\t%s\t%s\n", human(m.Advertise), state, m.Jobs, m.Capacity, orDash(human(m.Version)),
			st.Now.Sub(m.Heartbeat).Round(time.Second), human(m.ID), orDash(human(m.Pin)))
		jobs += len(m.Leases)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	h := st.History
	oldest := "-"
	if !h.Oldest.IsZero() {
		oldest = h.Oldest.Format(time.RFC3339)
	}
	fmt.Fprintf(w, "history: %d leases (%d live), oldest %s, %.1f MB in the database\n", h.Leases, h.Live, oldest, float64(h.Bytes)/1e6)
	if jobs == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GATEWAY\tJOB\tLEASE\tUSER\tHOST\tTOKEN\tTUNNEL\tPUBLIC\tSINCE")
	for _, m := range st.Members {
		for _, r := range m.Leases {
			var pub []string
			for _, a := range store.Attributions(r) {
				pub = append(pub, a.String())
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", human(m.Advertise), orDash(human(r.JobID)), r.ID, orDash(human(r.User)),
				orDash(human(r.Host)), orDash(r.Token), r.TunnelAddr(), orDash(strings.Join(pub, " ")), r.Start.Format(time.RFC3339))
		}
	}
	return tw.Flush()
}

// storeTokens are the token commands on the database directly.
func storeCreateToken(ctx context.Context, o storeOpts, name string, ttl time.Duration, importSecret string) (string, store.Token, error) {
	var secret string
	var tok store.Token
	err := withStoreDB(ctx, o, func(db *pgstore.Store) error {
		var err error
		if importSecret != "" {
			secret = ""
			tok, err = db.ImportToken(name, importSecret, ttl, time.Now())
			return err
		}
		secret, tok, err = db.CreateToken(name, ttl, time.Now())
		return err
	})
	return secret, tok, err
}

// storeKick is airlock kick --store: the gateway that holds the job ends
// it.
func storeKick(ctx context.Context, o storeOpts, job, reason string, ban time.Duration) (admin.KickResult, error) {
	var res admin.KickResult
	err := withStoreDB(ctx, o, func(db *pgstore.Store) error {
		r, kr, err := fleet.Kick(ctx, db, job, reason, ban, "airlock kick --store", 5*time.Second)
		if err != nil {
			return err
		}
		if !kr.Ended {
			return fmt.Errorf("kick %q: gateway %s: %s", job, r.Gateway, kr.Error)
		}
		res.Kicked = []admin.KickedLease{{Lease: r.ID, JobID: r.JobID, Addr: r.TunnelAddr(), Token: r.Token, Host: r.Host, Gateway: r.Gateway}}
		if ban > 0 {
			res.BannedUntil = time.Now().Add(ban)
		}
		return nil
	})
	return res, err
}

// storeFlags adds --store (also $AIRLOCK_STORE) and --store-password-file
// to cmd; extra ends --store's help.
func storeFlags(cmd *cobra.Command, o *storeOpts, extra string) {
	cmd.Flags().StringVar(&o.url, "store", "", storeUsage+extra)
	setEnv(cmd.Flags().Lookup("store"), StoreEnv)
	cmd.Flags().StringVar(&o.passwordFile, "store-password-file", "", storePasswordUsage)
	_ = cmd.MarkFlagFilename("store-password-file")
}

// useStore reports whether an admin command works on the fleet's
// database directly (an admin host): --store given, --state not.
func useStore(cmd *cobra.Command, o storeOpts) bool {
	return o.set() && !cmd.Flags().Changed("state")
}

// newDBCmd is airlock db and its subcommand migrate.
func newDBCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "db",
		Short: "manage a fleet's shared database (docs/fleet.md)",
		Args:  noArgs,
		RunE:  needSubcommand,
	}
	mig := &cobra.Command{
		Use:   "migrate --store URL",
		Short: "create or upgrade the fleet's schema (safe while gateways run)",
		Long: `Brings the shared database's schema to the version this airlock knows, as
the schema's owner (not the gateways' least-privilege role, docs/fleet.md).
Each migration runs in one transaction under an advisory lock; migrations
only add, so gateways keep running. A gateway refuses to start on a schema
older or newer than it knows.`,
		Example: `  airlock db migrate --store 'postgres://airlock_owner@db.example.org/airlock?sslmode=verify-full&sslrootcert=/etc/airlock/db-ca.pem'`,
		Args:    noArgs,
	}
	var o storeOpts
	storeFlags(mig, &o, "")
	mig.RunE = func(cmd *cobra.Command, args []string) error {
		return runDBMigrate(cmd.Context(), stdout, o)
	}
	cmd.AddCommand(mig)
	return cmd
}

// createToken makes a token through the gateway of state, or, on an admin
// host (useStore), in the fleet's database.
func createToken(ctx context.Context, cmd *cobra.Command, state string, o storeOpts, name string, ttl time.Duration) (string, store.Token, error) {
	if useStore(cmd, o) {
		return storeCreateToken(ctx, o, name, ttl, "")
	}
	return admin.CreateToken(ctx, state, name, ttl)
}

// importToken is createToken for an existing token.
func importToken(ctx context.Context, cmd *cobra.Command, state string, o storeOpts, name, secret string, ttl time.Duration) (store.Token, error) {
	if useStore(cmd, o) {
		_, t, err := storeCreateToken(ctx, o, name, ttl, secret)
		return t, err
	}
	return admin.ImportToken(ctx, state, name, secret, ttl)
}

// restrictToken sets a token's restrictions through the gateway of state,
// or in the fleet's database.
func restrictToken(cmd *cobra.Command, state string, o storeOpts, name string, rs admin.TokenRestrictions) (store.Token, error) {
	if !useStore(cmd, o) {
		return admin.RestrictToken(cmd.Context(), state, name, rs)
	}
	var t store.Token
	err := withStoreDB(cmd.Context(), o, func(db *pgstore.Store) error {
		var err error
		t, err = db.RestrictToken(name, store.TokenRestrictions{From: rs.From, Attest: rs.Attest})
		return err
	})
	return t, err
}

// listTokens lists the tokens of the gateway of state or of the fleet.
func listTokens(cmd *cobra.Command, state string, o storeOpts) ([]store.Token, error) {
	if !useStore(cmd, o) {
		return admin.ListTokens(cmd.Context(), state)
	}
	var toks []store.Token
	err := withStoreDB(cmd.Context(), o, func(db *pgstore.Store) error {
		var err error
		toks, err = db.Tokens()
		return err
	})
	return toks, err
}

// revokeToken revokes a token through the gateway of state (which ends
// and lists its leases), or in the fleet's database, whose gateways each
// end the token's leases on its notification.
func revokeToken(cmd *cobra.Command, state string, o storeOpts, name string) (admin.RevokeResult, error) {
	if !useStore(cmd, o) {
		return admin.RevokeToken(cmd.Context(), state, name)
	}
	err := withStoreDB(cmd.Context(), o, func(db *pgstore.Store) error { return db.RevokeToken(name) })
	if err != nil {
		return admin.RevokeResult{}, err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "airlock: token %s revoked in the fleet's database; every gateway ends its jobs' leases\n", name)
	return admin.RevokeResult{Ended: []admin.KickedLease{}}, nil
}
