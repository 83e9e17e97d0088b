// SPDX-License-Identifier: MIT

package pgstore_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/test/pgtest"
)

// openAs opens the store of database db as login role user for member gw.
func openAs(t *testing.T, c *pgtest.Cluster, user, db, gw string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), pgstore.Config{URL: c.URL(user, db), Gateway: gw})
	if err != nil {
		t.Fatalf("open as %s: %v", user, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testRoles: airlock db migrate makes the gateway and admin roles and
// their grants and row-level security; with a gateway's password alone
// one cannot create or revoke tokens, lift a ban, write a capture ticket,
// or change another gateway's lease records, attribution, member record
// or kick answers; the admin role can; gateway --check's privilege check
// names what a role lacks and what it holds beyond a gateway's needs.
func testRoles(t *testing.T, c *pgtest.Cluster) {
	db := c.CreateDB(t)
	owner := pgstore.Config{URL: c.URL(pgtest.Superuser, db)}
	ctx := context.Background()
	if _, _, err := pgstore.MigrateRoles(ctx, owner, pgstore.Roles{Gateways: []string{"rls_gw1", "rls_gw2"}, Admins: []string{"rls_ops"}}); err != nil {
		t.Fatal(err)
	}
	gw1 := openAs(t, c, "rls_gw1", db, "m1")
	gw2 := openAs(t, c, "rls_gw2", db, "m2")
	ops := openAs(t, c, "rls_ops", db, "")
	now := time.Now()

	// Tokens: an admin's.
	if _, _, err := gw1.CreateToken("stolen", 0, now); !errors.Is(err, store.ErrNotPermitted) || !strings.Contains(err.Error(), pgstore.AdminRole) {
		t.Errorf("create token as a gateway's role: %v, want ErrNotPermitted naming %s", err, pgstore.AdminRole)
	}
	if _, _, err := ops.CreateToken("site", 0, now); err != nil {
		t.Fatalf("create token as the admin role: %v", err)
	}
	if toks, err := gw1.Tokens(); err != nil || len(toks) != 1 {
		t.Errorf("gateway reads tokens: %d %v, want 1", len(toks), err)
	}
	if err := gw1.RevokeToken("site"); !errors.Is(err, store.ErrNotPermitted) {
		t.Errorf("revoke token as a gateway's role: %v, want ErrNotPermitted", err)
	}
	if _, err := gw1.RestrictToken("site", store.TokenRestrictions{}); !errors.Is(err, store.ErrNotPermitted) {
		t.Errorf("restrict token as a gateway's role: %v, want ErrNotPermitted", err)
	}

	// Bans: a gateway adds, never lifts.
	b, err := gw1.AddBan(store.Ban{Token: "site", Host: "node1", Until: now.Add(time.Hour)})
	if err != nil {
		t.Fatalf("add ban as a gateway's role: %v", err)
	}
	conn1 := c.Connect(t, db)
	for _, sql := range []string{"delete from airlock_bans", "update airlock_bans set until = now()"} {
		if _, err := conn1.Exec(ctx, "set role rls_gw2"); err != nil {
			t.Fatal(err)
		}
		_, err := conn1.Exec(ctx, sql)
		conn1.Exec(ctx, "reset role")
		if bans, _ := ops.Bans(time.Now()); len(bans) != 1 || bans[0].ID != b.ID {
			t.Errorf("%s as a gateway's role (%v): bans now %+v, want the ban kept", sql, err, bans)
		}
	}

	// Leases and attribution: each gateway its own.
	r := rec("l1", "192.0.2.1", 20000, 20127, now)
	if err := gw1.PutLeases([]store.LeaseRecord{r}); err != nil {
		t.Fatalf("record lease as gw1: %v", err)
	}
	forged := r
	forged.End, forged.EndReason, forged.User = now, "forged", "someone-else"
	if err := gw2.PutLeases([]store.LeaseRecord{forged}); !errors.Is(err, store.ErrNotPermitted) {
		t.Errorf("gw2 rewrites gw1's lease: %v, want ErrNotPermitted", err)
	}
	if _, err := conn1.Exec(ctx, "set role rls_gw2"); err != nil {
		t.Fatal(err)
	}
	_, err = conn1.Exec(ctx, "insert into airlock_attribution (lease_id, public_addr, port_lo, port_hi, start) values ('l1', '198.51.100.9', 1000, 1100, now())")
	_, derr := conn1.Exec(ctx, "delete from airlock_leases where id = 'l1'")
	_, merr := conn1.Exec(ctx, "update airlock_meta set value = 0 where key = 'max_block_span'")
	conn1.Exec(ctx, "reset role")
	if err == nil {
		t.Error("gw2 adds attribution to gw1's lease: accepted")
	}
	if recs, err := gw2.Whois(netip.MustParseAddr("192.0.2.1"), 20100, now.Add(time.Second)); err != nil || len(recs) != 1 || !recs[0].End.IsZero() || recs[0].User != r.User {
		t.Errorf("whois of gw1's lease after gw2's attempts (delete: %v, shrink meta: %v): %+v %v; want gw1's record unchanged", derr, merr, recs, err)
	}

	// Members: each its own record.
	if err := gw1.Heartbeat(store.Member{ID: "m1", Advertise: "gw1.example.org:8443", Pin: "sha256:gw1"}); err != nil {
		t.Fatal(err)
	}
	if err := gw2.Heartbeat(store.Member{ID: "m1", Advertise: "evil.example.org:8443", Pin: "sha256:evil", Capacity: 1 << 20}); !errors.Is(err, store.ErrNotPermitted) {
		t.Errorf("gw2 overwrites gw1's member record: %v, want ErrNotPermitted", err)
	}
	if ms, _ := ops.Members(); len(ms) != 1 || ms[0].Advertise != "gw1.example.org:8443" {
		t.Errorf("members after gw2's attempt: %+v", ms)
	}
	// A role's member records are bounded: the table every gateway reads
	// at each heartbeat cannot be flooded.
	var ferr error
	planted := 0
	for i := 0; i < 20 && ferr == nil; i++ {
		if ferr = gw2.Heartbeat(store.Member{ID: fmt.Sprintf("flood-%d", i), Advertise: "evil.example.org:8443"}); ferr == nil {
			planted++
		}
	}
	if planted != 16 || !errors.Is(ferr, store.ErrNotPermitted) {
		t.Errorf("member records by one gateway role: %d written, then %v; want 16, then ErrNotPermitted", planted, ferr)
	}

	// Capture tickets: only an admin writes one; only its gateway takes it.
	hash := func(s string) []byte { h := sha256.Sum256([]byte(s)); return h[:] }
	if _, err := gw2.RequestCapture(pgstore.Capture{Lease: "l1", Gateway: "m1", Job: "l1"}, hash("x"), time.Minute); !errors.Is(err, store.ErrNotPermitted) {
		t.Errorf("capture ticket written by a gateway's role: %v, want ErrNotPermitted", err)
	}
	id, err := ops.RequestCapture(pgstore.Capture{Lease: "l1", Gateway: "m1", Job: "l1"}, hash("x"), time.Minute)
	if err != nil {
		t.Fatalf("capture ticket by the admin role: %v", err)
	}
	if _, err := gw2.TakeCapture(id, "m1", hash("x")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("gw2 takes gw1's ticket: %v, want ErrNotFound", err)
	}
	if _, err := gw1.TakeCapture(id, "m1", hash("x")); err != nil {
		t.Errorf("gw1 takes its ticket: %v", err)
	}

	// Kicks: only the addressed gateway answers.
	kid, err := gw2.RequestKick(pgstore.Kick{Lease: "l1", Gateway: "m1"})
	if err != nil {
		t.Fatalf("kick asked by a gateway's role: %v", err)
	}
	gw2.FinishKick(kid, pgstore.KickResult{Ended: true})
	if _, ok, _ := gw1.PendingKick(kid, "m1"); !ok {
		t.Error("gw2 answered a kick addressed to gw1")
	}
	if err := gw1.FinishKick(kid, pgstore.KickResult{Ended: true}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := gw1.PendingKick(kid, "m1"); ok {
		t.Error("gw1's answer to its kick not recorded")
	}

	// Job credentials: a claim is its member's; a second claim names the
	// first holder; no role claims for another gateway.
	jh := sha256.Sum256([]byte("job credential"))
	if holder, _, err := gw1.ClaimJobCredential(jh[:], "m1", "l1"); err != nil || holder != "m1" {
		t.Errorf("gw1 claims a job credential: %q %v", holder, err)
	}
	if holder, lease, err := gw2.ClaimJobCredential(jh[:], "flood-0", "l2"); err != nil || holder != "m1" || lease != "l1" {
		t.Errorf("gw2 claims gw1's job credential: %q %q %v; want gw1's claim (m1, l1)", holder, lease, err)
	}
	other := sha256.Sum256([]byte("another job credential"))
	if _, _, err := gw2.ClaimJobCredential(other[:], "m1", "l3"); !errors.Is(err, store.ErrNotPermitted) {
		t.Errorf("gw2 claims a job credential in gw1's name: %v, want ErrNotPermitted", err)
	}

	// gateway --check's view of the roles.
	if missing, excess, err := gw1.GatewayPrivileges(ctx); err != nil || len(missing)+len(excess) != 0 {
		t.Errorf("privileges of a gateway role: missing %v, excess %v, %v; want none", missing, excess, err)
	}
	if _, excess, err := ops.GatewayPrivileges(ctx); err != nil || !slices.ContainsFunc(excess, func(s string) bool { return strings.Contains(s, "create tokens") }) {
		t.Errorf("privileges of the admin role as a gateway's: excess %v %v; want create tokens named", excess, err)
	}
	c.Exec(t, db, "revoke insert on airlock_leases from "+pgstore.GatewayRole)
	if missing, _, err := gw1.GatewayPrivileges(ctx); err != nil || !slices.Contains(missing, "INSERT on airlock_leases") {
		t.Errorf("privileges after a revoke: missing %v %v; want INSERT on airlock_leases", missing, err)
	}
	// A role may not be both.
	if _, _, err := pgstore.MigrateRoles(ctx, owner, pgstore.Roles{Admins: []string{"rls_gw1"}}); err == nil || !strings.Contains(err.Error(), "different roles") {
		t.Errorf("a gateway's role made an admin: %v, want refused", err)
	}
	// Migrate restores the grants it owns.
	if _, _, err := pgstore.MigrateRoles(ctx, owner, pgstore.Roles{Gateways: []string{"rls_gw1"}}); err != nil {
		t.Fatal(err)
	}
	if missing, _, _ := gw1.GatewayPrivileges(ctx); len(missing) != 0 {
		t.Errorf("after migrate: missing %v", missing)
	}
}

// testRolesUpgrade: a database of an older airlock (schema version 2,
// migrated without roles) upgraded by airlock db migrate works for the
// gateway role with no hand-written GRANT, also on the table version 2
// added; a table the schema has but grants.go does not know stops the
// migration with its name.
func testRolesUpgrade(t *testing.T, c *pgtest.Cluster) {
	db := c.CreateDB(t)
	conn := c.Connect(t, db)
	ctx := context.Background()
	if _, to, err := pgstore.MigrateWith(ctx, conn, pgstore.EmbeddedMigrations(2)); err != nil || to != 2 {
		t.Fatalf("old schema: %d %v", to, err)
	}
	owner := pgstore.Config{URL: c.URL(pgtest.Superuser, db)}
	// A live lease that an older gateway recorded.
	oldRec := rec("old-live", "192.0.2.2", 20000, 20127, time.Now())
	c.Exec(t, db, `insert into airlock_leases (id, gateway, start, record) values ('old-live', 'm-up', now(), $1)`, oldRec)
	if from, to, err := pgstore.MigrateRoles(ctx, owner, pgstore.Roles{Gateways: []string{"rls_up"}}); err != nil || from != 2 || to != pgstore.LatestVersion() {
		t.Fatalf("upgrade: %d→%d %v", from, to, err)
	}
	gw := openAs(t, c, "rls_up", db, "m-up")
	if err := gw.Heartbeat(store.Member{ID: "m-up", Advertise: "up:8443"}); err != nil {
		t.Errorf("heartbeat after the upgrade: %v", err)
	}
	if err := gw.PutLeases([]store.LeaseRecord{rec("new", "192.0.2.3", 20000, 20127, time.Now())}); err != nil {
		t.Errorf("record a lease after the upgrade: %v", err)
	}
	oldRec.End, oldRec.EndReason = time.Now(), "released"
	if err := gw.PutLeases([]store.LeaseRecord{oldRec}); err != nil {
		t.Errorf("end a lease recorded before the upgrade: %v", err)
	}
	if _, err := gw.TakeCapture(1, "m-up", []byte("x")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("read capture tickets (version 2's table) after the upgrade: %v, want ErrNotFound (no ticket), not a permission error", err)
	}
	c.Exec(t, db, "create table airlock_unknown (x int)")
	if _, _, err := pgstore.MigrateRoles(ctx, owner, pgstore.Roles{Gateways: []string{"rls_up"}}); err == nil || !strings.Contains(err.Error(), "airlock_unknown") {
		t.Errorf("migrate with a table grants.go does not know: %v, want it named", err)
	}
}

// testRolesOwnerWithoutCreateRole: an owner without CREATEROLE migrates a
// fresh database once a DBA made the two group roles, and the grants and
// row-level security work for a gateway role the DBA made a member.
func testRolesOwnerWithoutCreateRole(t *testing.T, c *pgtest.Cluster) {
	db := c.CreateDB(t)
	c.Exec(t, db, "do $$ begin if not exists (select from pg_roles where rolname = 'plain_owner') then create role plain_owner login; end if; end $$")
	c.Exec(t, db, "alter database "+db+" owner to plain_owner")
	c.Exec(t, db, "do $$ begin if not exists (select from pg_roles where rolname = '"+pgstore.GatewayRole+"') then create role "+pgstore.GatewayRole+" nologin; end if; end $$")
	c.Exec(t, db, "do $$ begin if not exists (select from pg_roles where rolname = '"+pgstore.AdminRole+"') then create role "+pgstore.AdminRole+" nologin; end if; end $$")
	c.Exec(t, db, "do $$ begin if not exists (select from pg_roles where rolname = 'plain_gw') then create role plain_gw login; end if; end $$")
	c.Exec(t, db, "grant "+pgstore.GatewayRole+" to plain_gw")
	if _, to, err := pgstore.Migrate(context.Background(), pgstore.Config{URL: c.URL("plain_owner", db)}); err != nil || to != pgstore.LatestVersion() {
		t.Fatalf("migrate as an owner without CREATEROLE, roles made by a DBA: %d %v", to, err)
	}
	gw := openAs(t, c, "plain_gw", db, "m-plain")
	if err := gw.Heartbeat(store.Member{ID: "m-plain", Advertise: "plain:8443"}); err != nil {
		t.Errorf("heartbeat as a gateway role: %v", err)
	}
	if _, _, err := gw.CreateToken("x", 0, time.Now()); !errors.Is(err, store.ErrNotPermitted) {
		t.Errorf("create token as a gateway role: %v, want ErrNotPermitted", err)
	}
}
