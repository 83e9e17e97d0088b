// SPDX-License-Identifier: MIT

package pgstore

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Roles (migrations/003_roles.sql makes them; Migrate grants them). A
// site's login roles are members of one of them: each gateway its own
// login role in GatewayRole, the admin hosts' in AdminRole.
const (
	// GatewayRole may read the fleet's tokens, bans, members and
	// history, and write only its own lease records, attribution and
	// member record, add bans and kicks, and answer the kicks and
	// capture tickets addressed to it. It may not create, change or
	// revoke tokens, lift bans, write capture tickets, or write another
	// gateway's records (row-level security, migration 003).
	GatewayRole = "airlock_fleet_gateway"
	// AdminRole may do everything to the fleet's rows (not to the
	// schema, which its owner migrates).
	AdminRole = "airlock_fleet_admin"
)

// privileges is what GatewayRole and AdminRole hold on one table or
// sequence of the schema. Every table and sequence of the schema has an
// entry: Migrate fails naming one that has none (a migration that adds a
// table adds its grants here).
type privileges struct {
	sequence       bool
	gateway, admin string
}

// grants are the schema's privileges by table and sequence.
var grants = map[string]privileges{
	VersionTable:              {gateway: "select", admin: "select"},
	"airlock_tokens":          {gateway: "select", admin: "select, insert, update, delete"},
	"airlock_bans":            {gateway: "select, insert, delete", admin: "select, insert, update, delete"},
	"airlock_leases":          {gateway: "select, insert, update, delete", admin: "select, insert, update, delete"},
	"airlock_attribution":     {gateway: "select, insert", admin: "select, insert, update, delete"},
	"airlock_meta":            {gateway: "select, insert, update", admin: "select, insert, update, delete"},
	"airlock_gateways":        {gateway: "select, insert, update", admin: "select, insert, update, delete"},
	"airlock_kicks":           {gateway: "select, insert, update", admin: "select, insert, update, delete"},
	"airlock_captures":        {gateway: "select, update", admin: "select, insert, update, delete"},
	"airlock_job_credentials": {gateway: "select, insert, delete", admin: "select, insert, update, delete"},
	"airlock_bans_id_seq":     {sequence: true, gateway: "usage, select", admin: "usage, select, update"},
	"airlock_kicks_id_seq":    {sequence: true, gateway: "usage, select", admin: "usage, select, update"},
	"airlock_captures_id_seq": {sequence: true, admin: "usage, select, update"},
}

// Roles names login roles to make members of GatewayRole and AdminRole
// (airlock db migrate --gateway-role, --admin-role); a role that does not
// exist is made (LOGIN, without a password: the site sets one, or uses
// client certificates, as pg_hba.conf says).
type Roles struct {
	Gateways, Admins []string
}

// applyGrants grants the schema's privileges to GatewayRole and
// AdminRole, makes the login roles of rs members, and checks that every
// table and sequence of the schema is known to grants. It runs under the
// migration lock, in one transaction.
func applyGrants(ctx context.Context, conn *pgx.Conn, rs Roles) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "select pg_advisory_xact_lock($1)", migrationLock); err != nil {
		return fmt.Errorf("grant: lock: %w", err)
	}
	rows, err := tx.Query(ctx, `select c.relname::text from pg_class c join pg_namespace n on n.oid = c.relnamespace
		where n.nspname = current_schema() and c.relkind in ('r', 'S', 'p') and c.relname like 'airlock\_%'`)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	present, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	sort.Strings(present)
	for _, name := range present {
		p, ok := grants[name]
		if !ok {
			return fmt.Errorf("grant: the schema has %s, which grants.go does not know: add its privileges there", name)
		}
		kind := "table"
		if p.sequence {
			kind = "sequence"
		}
		id := pgx.Identifier{name}.Sanitize()
		for role, priv := range map[string]string{GatewayRole: p.gateway, AdminRole: p.admin} {
			r := pgx.Identifier{role}.Sanitize()
			// Exactly what the table says: revoke first, so that a
			// privilege taken away by a newer airlock goes.
			if _, err := tx.Exec(ctx, fmt.Sprintf("revoke all on %s %s from %s", kind, id, r)); err != nil {
				return fmt.Errorf("grant on %s: %w", name, err)
			}
			if priv == "" {
				continue
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf("grant %s on %s %s to %s", priv, kind, id, r)); err != nil {
				return fmt.Errorf("grant on %s: %w", name, err)
			}
		}
	}
	for group, members := range map[string][]string{GatewayRole: rs.Gateways, AdminRole: rs.Admins} {
		for _, m := range members {
			if err := grantMember(ctx, tx, group, m); err != nil {
				return err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	return nil
}

// grantMember makes login role m (made if absent) a member of group.
func grantMember(ctx context.Context, tx pgx.Tx, group, m string) error {
	if m == "" || strings.HasPrefix(m, "pg_") || m == GatewayRole || m == AdminRole {
		return fmt.Errorf("role %q: name a login role of your own", m)
	}
	other := AdminRole
	if group == AdminRole {
		other = GatewayRole
	}
	var exists, inOther bool
	if err := tx.QueryRow(ctx, `select exists (select from pg_roles where rolname = $1),
		coalesce((select pg_has_role(oid, $2, 'member') from pg_roles where rolname = $1), false)`, m, other).Scan(&exists, &inOther); err != nil {
		return fmt.Errorf("role %s: %w", m, err)
	}
	if exists && inOther {
		return fmt.Errorf("role %s is already a member of %s: a gateway's role and an admin's must be different roles (the point is that a gateway's password does not do an admin's work)", m, other)
	}
	id := pgx.Identifier{m}.Sanitize()
	if !exists {
		if _, err := tx.Exec(ctx, "create role "+id+" login"); err != nil {
			return fmt.Errorf("create role %s: %w", m, err)
		}
	}
	if _, err := tx.Exec(ctx, "grant "+pgx.Identifier{group}.Sanitize()+" to "+id); err != nil {
		return fmt.Errorf("grant %s to %s: %w", group, m, err)
	}
	return nil
}

// GatewayPrivileges returns what the role of s lacks of what a gateway
// needs (each as "PRIVILEGE on TABLE"), and what it holds beyond it that
// makes its password the keys to the site (creating tokens, lifting bans,
// writing capture tickets, changing the schema), for gateway --check.
func (s *Store) GatewayPrivileges(ctx context.Context) (missing, excess []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var names []string
	for name := range grants {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := grants[name]
		fn := "has_table_privilege"
		if p.sequence {
			fn = "has_sequence_privilege"
		}
		for _, priv := range strings.Split(p.gateway, ", ") {
			if priv == "" {
				continue
			}
			var ok bool
			if err := s.pool.QueryRow(ctx, "select "+fn+"(current_user, $1, $2)", name, priv).Scan(&ok); err != nil {
				return nil, nil, fmt.Errorf("check privileges: %w", tlsFailure(err))
			}
			if !ok {
				missing = append(missing, strings.ToUpper(priv)+" on "+name)
			}
		}
	}
	for _, c := range []struct{ table, priv, what string }{
		{"airlock_tokens", "INSERT", "create tokens"},
		{"airlock_tokens", "DELETE", "revoke tokens"},
		{"airlock_bans", "UPDATE", "lift bans"},
		{"airlock_captures", "INSERT", "write capture tickets"},
	} {
		var ok bool
		if err := s.pool.QueryRow(ctx, "select has_table_privilege(current_user, $1, $2)", c.table, c.priv).Scan(&ok); err != nil {
			return nil, nil, fmt.Errorf("check privileges: %w", tlsFailure(err))
		}
		if ok {
			excess = append(excess, c.what+" ("+c.priv+" on "+c.table+")")
		}
	}
	var bypass bool
	if err := s.pool.QueryRow(ctx, `select rolsuper or rolbypassrls or pg_has_role(current_user, (select tableowner from pg_tables
		where tablename = 'airlock_leases' and schemaname = current_schema()), 'member') from pg_roles where rolname = current_user`).Scan(&bypass); err != nil {
		return nil, nil, fmt.Errorf("check privileges: %w", tlsFailure(err))
	}
	if bypass {
		excess = append(excess, "write every gateway's records (a superuser, the schema's owner or BYPASSRLS: row-level security does not hold it)")
	}
	return missing, excess, nil
}
