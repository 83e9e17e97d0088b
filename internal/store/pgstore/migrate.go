// SPDX-License-Identifier: MIT

package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The schema's versions. Migration n (migrations/NNN_name.sql, numbered
// from 1 without gaps) takes the schema from version n-1 to n; the
// database's version is the one row of VersionTable (0: nothing applied).
//
// Migrate applies what is missing, each migration in a transaction of its
// own that first takes a transaction-level advisory lock
// (pg_advisory_xact_lock, released at commit or rollback), then reads the
// version, applies the next migration and writes its number. So two
// migrations never interleave, a migration that fails leaves the schema at
// the version before it, and a connection lost half-way leaves no lock
// behind. Gateways never take the lock: they read the version (Open,
// CheckSchema) and go on while a migration runs, which is safe because
// migrations only add.
//
// VersionTable has the layout of the jackc/tern migrator that applied
// version 1 before (one row, "version int4 not null"), and the lock key is
// tern's, so a database migrated by an older airlock needs nothing.

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLock is the advisory lock key that serializes migrations.
const migrationLock = int64(9628173550095224)

// migration is one step of the schema.
type migration struct {
	version int32
	name    string
	sql     string
}

// migrations returns the embedded migrations in order.
func migrations() ([]migration, error) {
	ents, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range ents {
		num, _, ok := strings.Cut(e.Name(), "_")
		n, err := strconv.Atoi(num)
		if !ok || err != nil || n != len(out)+1 || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("migration %s: want the name %03d_NAME.sql (numbered from 1 without gaps)", e.Name(), len(out)+1)
		}
		b, err := fs.ReadFile(migrationFS, "migrations/"+e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: int32(n), name: strings.TrimSuffix(e.Name(), ".sql"), sql: string(b)})
	}
	return out, nil
}

// LatestVersion is the schema version this code knows: its number of
// migrations.
func LatestVersion() int32 {
	ms, err := migrations()
	if err != nil {
		panic(err) // the embedded files are checked by the package's tests
	}
	return int32(len(ms))
}

// Migrate brings the database's schema to LatestVersion and returns the
// versions before and after. It is safe while gateways run and while
// another Migrate runs (see above). A database newer than this code is
// left alone with ErrSchemaNew.
func Migrate(ctx context.Context, cfg Config) (from, to int32, err error) {
	return MigrateRoles(ctx, cfg, Roles{})
}

// MigrateRoles is Migrate that also makes the login roles of rs members
// of GatewayRole and AdminRole. After any migration, or with roles, it
// grants the schema's privileges (grants.go) to both group roles, so that
// every table, also one an upgrade adds, works for them with no
// hand-written GRANT.
func MigrateRoles(ctx context.Context, cfg Config, rs Roles) (from, to int32, err error) {
	pc, err := poolConfig(cfg)
	if err != nil {
		return 0, 0, err
	}
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err != nil {
		return 0, 0, fmt.Errorf("connect to database: %w", tlsFailure(err))
	}
	defer conn.Close(context.Background())
	ms, err := migrations()
	if err != nil {
		return 0, 0, err
	}
	from, to, err = migrate(ctx, conn, ms)
	if err != nil || (from == to && len(rs.Gateways)+len(rs.Admins) == 0) {
		return from, to, err
	}
	return from, to, applyGrants(ctx, conn, rs)
}

// migrate applies ms to the database of conn, one transaction each.
func migrate(ctx context.Context, conn *pgx.Conn, ms []migration) (from, to int32, err error) {
	from = -1
	for {
		before, after, err := migrateStep(ctx, conn, ms)
		if from < 0 {
			from = before
		}
		if err != nil {
			return from, before, err
		}
		if after == before {
			return from, after, nil
		}
	}
}

// migrateStep applies the migration that follows the database's version,
// if any, and returns the versions before and after.
func migrateStep(ctx context.Context, conn *pgx.Conn, ms []migration) (before, after int32, err error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "select pg_advisory_xact_lock($1)", migrationLock); err != nil {
		return 0, 0, fmt.Errorf("migrate: lock: %w", err)
	}
	// Created only when absent (under the lock, so no race): a role that
	// may not create tables can still see that nothing is to be done.
	var exists bool
	if err := tx.QueryRow(ctx, "select to_regclass($1) is not null", VersionTable).Scan(&exists); err != nil {
		return 0, 0, fmt.Errorf("migrate: %w", err)
	}
	if !exists {
		if _, err := tx.Exec(ctx, "create table "+VersionTable+" (version int4 not null); insert into "+VersionTable+" (version) values (0)"); err != nil {
			return 0, 0, fmt.Errorf("migrate: create %s: %w", VersionTable, err)
		}
	}
	var rows int
	var v *int32
	if err := tx.QueryRow(ctx, "select count(*), max(version) from "+VersionTable).Scan(&rows, &v); err != nil {
		return 0, 0, fmt.Errorf("migrate: read schema version: %w", err)
	}
	if rows != 1 || v == nil {
		return 0, 0, fmt.Errorf("migrate: %s holds %d rows, want one (the schema version)", VersionTable, rows)
	}
	before = *v
	latest := int32(len(ms))
	switch {
	case before > latest:
		return before, before, fmt.Errorf("%w: it is at version %d, this airlock knows %d; migrate with the newest airlock of the fleet", ErrSchemaNew, before, latest)
	case before < 0:
		return before, before, fmt.Errorf("migrate: schema version %d is invalid", before)
	case before == latest:
		return before, before, tx.Commit(ctx)
	}
	m := ms[before]
	// Without arguments, Exec sends the file as one simple query: every
	// statement in it, in this transaction.
	if _, err := tx.Exec(ctx, m.sql); err != nil {
		if pgErr(err, "42501") && strings.Contains(err.Error(), "create role") {
			return before, before, fmt.Errorf("migrate: migration %s: %w; the schema's owner needs CREATEROLE to make the roles %s and %s, or a DBA makes them first (create role … nologin, docs/fleet.md)",
				m.name, err, GatewayRole, AdminRole)
		}
		return before, before, fmt.Errorf("migrate: migration %s: %w", m.name, err)
	}
	// A migration's "set" must not outlive it on this connection.
	if _, err := tx.Exec(ctx, "reset all"); err != nil {
		return before, before, fmt.Errorf("migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, "update "+VersionTable+" set version = $1", m.version); err != nil {
		return before, before, fmt.Errorf("migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return before, before, fmt.Errorf("migrate: migration %s: %w", m.name, err)
	}
	return before, m.version, nil
}
