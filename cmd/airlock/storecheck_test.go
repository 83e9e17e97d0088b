// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/preflight"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/test/pgtest"
)

// TestStoreCheckPrivileges: gateway --check's fleet database item checks
// the role's privileges: OK for a gateway role made by airlock db migrate,
// a problem naming the missing privilege once one is revoked, a warning
// that names the admin's work for a role that may create tokens.
func TestStoreCheckPrivileges(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	pgtest.Require(t)
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	if _, _, err := pgstore.MigrateRoles(context.Background(), pgstore.Config{URL: c.URL(pgtest.Superuser, db)},
		pgstore.Roles{Gateways: []string{"check_gw"}}); err != nil {
		t.Fatal(err)
	}
	r := storeCheck(gateway.StoreConfig{URL: c.URL("check_gw", db)})
	if r.Status != preflight.OK {
		t.Errorf("gateway role: %+v, want OK", r)
	}
	c.Exec(t, db, "revoke update on airlock_gateways from "+pgstore.GatewayRole)
	r = storeCheck(gateway.StoreConfig{URL: c.URL("check_gw", db)})
	if r.Status != preflight.Problem || !strings.Contains(r.Detail, "UPDATE on airlock_gateways") || !strings.Contains(r.Fix, "airlock db migrate") {
		t.Errorf("gateway role without UPDATE on airlock_gateways: %+v, want a problem naming it and the fix", r)
	}
	r = storeCheck(gateway.StoreConfig{URL: c.URL(pgtest.Superuser, db)})
	if r.Status != preflight.Warn || !strings.Contains(r.Detail, "create tokens") {
		t.Errorf("the schema owner as a gateway's role: %+v, want a warning naming create tokens", r)
	}
}

// TestFleetKeyCheck: gateway --check says when --fleet-key is missing (a
// warning: no failover), unreadable or readable by others (a problem),
// and OK for a key made by airlock db fleet-key.
func TestFleetKeyCheck(t *testing.T) {
	if r := fleetKeyCheck(""); r.Status != preflight.Warn || !strings.Contains(r.Fix, "airlock db fleet-key") {
		t.Errorf("no key: %+v, want a warning naming airlock db fleet-key", r)
	}
	path := filepath.Join(t.TempDir(), "fleet.key")
	if r := fleetKeyCheck(path); r.Status != preflight.Problem {
		t.Errorf("missing key file: %+v, want a problem", r)
	}
	if err := fleet.NewKeyFile(path); err != nil {
		t.Fatal(err)
	}
	if r := fleetKeyCheck(path); r.Status != preflight.OK {
		t.Errorf("key made by db fleet-key: %+v, want OK", r)
	}
	os.Chmod(path, 0o644)
	if r := fleetKeyCheck(path); r.Status != preflight.Problem || !strings.Contains(r.Detail, "chmod 600") {
		t.Errorf("key readable by others: %+v, want a problem naming chmod 600", r)
	}
}
