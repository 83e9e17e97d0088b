// SPDX-License-Identifier: MIT

package pgstore

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Migration is a migration of a test's own list (MigrateWith).
type Migration struct {
	Name, SQL string
}

// MigrateWith applies ms (versions 1…len(ms)) as Migrate applies the
// embedded migrations.
func MigrateWith(ctx context.Context, conn *pgx.Conn, ms []Migration) (from, to int32, err error) {
	var list []migration
	for i, m := range ms {
		list = append(list, migration{version: int32(i + 1), name: m.Name, sql: m.SQL})
	}
	return migrate(ctx, conn, list)
}

// Migrations returns the embedded migrations' names, checked.
func Migrations() ([]string, error) {
	ms, err := migrations()
	var names []string
	for _, m := range ms {
		names = append(names, m.name)
	}
	return names, err
}

// EmbeddedMigrations returns the first n embedded migrations, for a test
// of an upgrade from an older schema.
func EmbeddedMigrations(n int) []Migration {
	ms, err := migrations()
	if err != nil {
		panic(err)
	}
	var out []Migration
	for _, m := range ms[:n] {
		out = append(out, Migration{Name: m.name, SQL: m.sql})
	}
	return out
}
