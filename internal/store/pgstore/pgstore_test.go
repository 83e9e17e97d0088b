// SPDX-License-Identifier: MIT

package pgstore_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/test/pgtest"
)

// TestPostgres runs every test of the store against one real PostgreSQL
// cluster (test/pgtest), each in a database of its own.
func TestPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	pgtest.Require(t)
	c := pgtest.Start(t)
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, *pgtest.Cluster)
	}{
		{"Migrate", testMigrate},
		{"MigrateConcurrent", testMigrateConcurrent},
		{"MigrateFailureRollsBack", testMigrateFailure},
		{"MigrateWhileServing", testMigrateWhileServing},
		{"MigrateAsGatewayRole", testMigrateAsGatewayRole},
		{"Tokens", testTokens},
		{"Bans", testBans},
		{"Whois", testWhois},
		{"PutLeasesIdempotent", testPutLeases},
		{"Prune", testPrune},
		{"Notify", testNotify},
		{"TLSAndPasswordFile", testTLS},
		{"Members", testMembers},
		{"Kicks", testKicks},
		{"CaptureTickets", testCaptureTickets},
		{"Roles", testRoles},
		{"RolesUpgrade", testRolesUpgrade},
		{"RolesOwnerWithoutCreateRole", testRolesOwnerWithoutCreateRole},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, c) })
	}
}

// open migrates a fresh database and opens the store on it for gateway gw.
func open(t *testing.T, c *pgtest.Cluster, gw string) (*pgstore.Store, string) {
	t.Helper()
	db := c.CreateDB(t)
	cfg := pgstore.Config{URL: c.URL(pgtest.Superuser, db), Gateway: gw}
	if _, _, err := pgstore.Migrate(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, db
}

func testMigrate(t *testing.T, c *pgtest.Cluster) {
	db := c.CreateDB(t)
	cfg := pgstore.Config{URL: c.URL(pgtest.Superuser, db)}
	ctx := context.Background()
	if _, err := pgstore.Open(ctx, cfg); !errors.Is(err, pgstore.ErrSchemaOld) {
		t.Fatalf("open before migrate: got %v, want ErrSchemaOld", err)
	}
	from, to, err := pgstore.Migrate(ctx, cfg)
	if err != nil || from != 0 || to != pgstore.LatestVersion() {
		t.Fatalf("migrate: got %d→%d %v, want 0→%d", from, to, err, pgstore.LatestVersion())
	}
	from, to, err = pgstore.Migrate(ctx, cfg)
	if err != nil || from != to || to != pgstore.LatestVersion() {
		t.Fatalf("second migrate: got %d→%d %v, want no change", from, to, err)
	}
	s, err := pgstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// A newer schema than this code knows is refused, by Open and Migrate.
	c.Exec(t, db, "update "+pgstore.VersionTable+" set version = version + 1")
	if _, err := pgstore.Open(ctx, cfg); !errors.Is(err, pgstore.ErrSchemaNew) {
		t.Fatalf("open newer schema: got %v, want ErrSchemaNew", err)
	}
	if _, _, err := pgstore.Migrate(ctx, cfg); !errors.Is(err, pgstore.ErrSchemaNew) {
		t.Fatalf("migrate newer schema: got %v, want ErrSchemaNew", err)
	}
	// A version table that is not one row is refused, not guessed.
	c.Exec(t, db, "insert into "+pgstore.VersionTable+" values (1)")
	if _, _, err := pgstore.Migrate(ctx, cfg); err == nil || !strings.Contains(err.Error(), "2 rows") {
		t.Fatalf("migrate with two version rows: got %v, want a refusal", err)
	}
	names, err := pgstore.Migrations()
	if err != nil || int32(len(names)) != pgstore.LatestVersion() {
		t.Fatalf("embedded migrations: %v %v", names, err)
	}
}

// testMigrateConcurrent runs four migrations of a fresh database at once
// (two admins, or an upgrade script on several hosts): the advisory lock
// serializes them, each migration is applied once, all succeed. Once with
// the embedded migrations, once with a list whose migrations would notice
// being applied twice (each adds a row).
func testMigrateConcurrent(t *testing.T, c *pgtest.Cluster) {
	ctx := context.Background()
	ms := []pgstore.Migration{
		{Name: "001_a", SQL: "create table t_applied (name text); insert into t_applied values ('a');"},
		{Name: "002_b", SQL: "select pg_sleep(0.05); insert into t_applied values ('b');"},
		{Name: "003_c", SQL: "insert into t_applied values ('c');"},
	}
	for _, embedded := range []bool{true, false} {
		db := c.CreateDB(t)
		url := c.URL(pgtest.Superuser, db)
		want := int32(len(ms))
		if embedded {
			want = pgstore.LatestVersion()
		}
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				var to int32
				var err error
				if embedded {
					_, to, err = pgstore.Migrate(ctx, pgstore.Config{URL: url})
				} else {
					var conn *pgx.Conn
					if conn, err = pgx.Connect(ctx, url); err != nil {
						errs <- err
						return
					}
					defer conn.Close(ctx)
					_, to, err = pgstore.MigrateWith(ctx, conn, ms)
				}
				if err == nil && to != want {
					err = fmt.Errorf("ended at version %d, want %d", to, want)
				}
				errs <- err
			}()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Errorf("concurrent migrate (embedded %v): %v", embedded, err)
			}
		}
		if embedded {
			s, err := pgstore.Open(ctx, pgstore.Config{URL: url})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			continue
		}
		var applied string
		conn := c.Connect(t, db)
		if err := conn.QueryRow(ctx, "select string_agg(name, '' order by name) from t_applied").Scan(&applied); err != nil || applied != "abc" {
			t.Errorf("migrations applied by four concurrent runs: %q %v, want each once (abc)", applied, err)
		}
	}
}

// testMigrateFailure: a migration that fails half-way leaves the schema at
// the version before it, with nothing of it applied, and says which.
func testMigrateFailure(t *testing.T, c *pgtest.Cluster) {
	db := c.CreateDB(t)
	conn := c.Connect(t, db)
	ctx := context.Background()
	ms := []pgstore.Migration{
		{Name: "001_a", SQL: "create table t_a (x int);"},
		{Name: "002_b", SQL: "create table t_b (x int); set search_path = nowhere; insert into t_missing values (1);"},
	}
	from, to, err := pgstore.MigrateWith(ctx, conn, ms)
	if err == nil || !strings.Contains(err.Error(), "002_b") || from != 0 || to != 1 {
		t.Fatalf("failing migration: got %d→%d %v, want 0→1 and an error naming 002_b", from, to, err)
	}
	var tb, ta *string
	if err := conn.QueryRow(ctx, "select to_regclass('t_a')::text, to_regclass('t_b')::text").Scan(&ta, &tb); err != nil {
		t.Fatal(err)
	}
	if ta == nil || tb != nil {
		t.Errorf("after the failure: t_a %v, t_b %v; want t_a kept and t_b rolled back", ta, tb)
	}
	// Fixed, it applies from where it stopped; its set does not outlive it.
	ms[1].SQL = "create table t_b (x int); set search_path = nowhere;"
	if from, to, err := pgstore.MigrateWith(ctx, conn, ms); err != nil || from != 1 || to != 2 {
		t.Fatalf("fixed migration: got %d→%d %v, want 1→2", from, to, err)
	}
	var sp string
	if err := conn.QueryRow(ctx, "show search_path").Scan(&sp); err != nil || strings.Contains(sp, "nowhere") {
		t.Errorf("search_path after the migrations: %q %v, want it reset", sp, err)
	}
}

// testMigrateWhileServing applies a migration while a store answers a
// stream of calls, as a fleet's gateways do during airlock db migrate.
func testMigrateWhileServing(t *testing.T, c *pgtest.Cluster) {
	s, db := open(t, c, "gw")
	conn := c.Connect(t, db)
	ctx := context.Background()
	ms := []pgstore.Migration{{Name: "001_fleet", SQL: "select 1"},
		{Name: "002_more", SQL: "alter table airlock_tokens add column note text; select pg_sleep(0.3); create index airlock_tokens_note on airlock_tokens (note);"}}
	if _, err := conn.Exec(ctx, "update "+pgstore.VersionTable+" set version = 1"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	calls := make(chan error, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				calls <- nil
				return
			default:
			}
			if _, err := s.Tokens(); err != nil {
				calls <- fmt.Errorf("call %d during the migration: %w", n, err)
				return
			}
			n++
		}
	}()
	from, to, err := pgstore.MigrateWith(ctx, conn, ms)
	close(stop)
	if err != nil || from != 1 || to != 2 {
		t.Fatalf("migrate while serving: %d→%d %v", from, to, err)
	}
	if err := <-calls; err != nil {
		t.Error(err)
	}
}

// testMigrateAsGatewayRole: the gateways' role may not change the schema;
// on an up-to-date one, airlock db migrate with it still says so, and on an
// old one it fails with PostgreSQL's refusal and changes nothing.
func testMigrateAsGatewayRole(t *testing.T, c *pgtest.Cluster) {
	_, db := open(t, c, "")
	c.Exec(t, db, "do $$ begin if not exists (select from pg_roles where rolname = 'mig_gw') then create role mig_gw login; end if; end $$")
	c.Exec(t, db, "grant select on "+pgstore.VersionTable+" to mig_gw")
	cfg := pgstore.Config{URL: c.URL("mig_gw", db)}
	ctx := context.Background()
	if from, to, err := pgstore.Migrate(ctx, cfg); err != nil || from != to {
		t.Fatalf("migrate as the gateways' role, schema up to date: %d→%d %v", from, to, err)
	}
	empty := c.CreateDB(t)
	cfg.URL = c.URL("mig_gw", empty)
	if _, _, err := pgstore.Migrate(ctx, cfg); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("migrate a fresh database as the gateways' role: %v, want permission denied", err)
	}
}

func testTokens(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "")
	now := time.Now()
	secret, tok, err := s.CreateToken("site-a", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateToken("site-a", 0, now); !errors.Is(err, store.ErrExists) {
		t.Fatalf("duplicate name: got %v, want ErrExists", err)
	}
	if _, _, err := s.CreateToken("bad name", 0, now); !errors.Is(err, store.ErrInvalidName) {
		t.Fatalf("bad name: got %v, want ErrInvalidName", err)
	}
	got, err := s.VerifyToken(secret, now)
	if err != nil || got.Name != "site-a" || !got.Expires.Equal(tok.Expires) {
		t.Fatalf("verify: got %+v %v, want site-a", got, err)
	}
	if _, err := s.VerifyToken(secret, now.Add(2*time.Hour)); !errors.Is(err, store.ErrTokenExpired) {
		t.Fatalf("verify expired: got %v, want ErrTokenExpired", err)
	}
	if _, err := s.VerifyToken(store.TokenPrefix+"nope", now); !errors.Is(err, store.ErrBadToken) {
		t.Fatalf("verify unknown: got %v, want ErrBadToken", err)
	}
	// A token made on another gateway (or the embedded store) imports.
	other, _ := store.NewTokenSecret()
	if _, err := s.ImportToken("", other, 0, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ImportToken("again", other, 0, now); !errors.Is(err, store.ErrExists) {
		t.Fatalf("import twice: got %v, want ErrExists", err)
	}
	if _, err := s.ImportToken("x", "alk1_short", 0, now); !errors.Is(err, store.ErrBadToken) {
		t.Fatalf("import malformed: got %v, want ErrBadToken", err)
	}
	toks, err := s.Tokens()
	if err != nil || len(toks) != 2 {
		t.Fatalf("tokens: got %d %v, want 2", len(toks), err)
	}
	from := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	if got, err := s.RestrictToken("site-a", store.TokenRestrictions{From: from, Attest: true}); err != nil || !got.Attest || len(got.From) != 1 {
		t.Fatalf("restrict: got %+v %v", got, err)
	}
	if got, err := s.VerifyToken(secret, now); err != nil || !got.Attest || len(got.From) != 1 || got.From[0] != from[0] {
		t.Fatalf("verify a restricted token: got %+v %v, want its restrictions", got, err)
	}
	if _, err := s.RestrictToken("nosuch", store.TokenRestrictions{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("restrict unknown: got %v, want ErrNotFound", err)
	}
	if got, err := s.Token("site-a"); err != nil || got.Name != "site-a" || got.Hash != nil || !got.Expires.Equal(tok.Expires) {
		t.Fatalf("token site-a: got %+v %v, want its record without hash", got, err)
	}
	if err := s.RevokeToken("site-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Token("site-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("token site-a after revoke: got %v, want ErrNotFound", err)
	}
	if err := s.RevokeToken("site-a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke twice: got %v, want ErrNotFound", err)
	}
	if _, err := s.VerifyToken(secret, now); !errors.Is(err, store.ErrBadToken) {
		t.Fatalf("verify revoked: got %v, want ErrBadToken", err)
	}
}

func testBans(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "")
	now := time.Now()
	a, err := s.AddBan(store.Ban{Token: "t", Host: "node1", Until: now.Add(time.Hour), Created: now})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.AddBan(store.Ban{Token: "t", Addr: netip.MustParseAddr("198.51.100.2"), Until: now.Add(time.Minute), Created: now})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == 0 || b.ID <= a.ID {
		t.Fatalf("ids: got %d, %d, want increasing", a.ID, b.ID)
	}
	if _, err := s.AddBan(store.Ban{Token: "t", Until: now}); err == nil {
		t.Fatal("ban without host or address accepted")
	}
	bans, err := s.Bans(now.Add(30 * time.Minute))
	if err != nil || len(bans) != 1 || bans[0].Host != "node1" {
		t.Fatalf("bans in 30m: got %+v %v, want the host ban", bans, err)
	}
	bans, _ = s.Bans(now)
	if len(bans) != 2 || bans[1].Addr != b.Addr {
		t.Fatalf("bans now: got %+v, want both", bans)
	}
}

func rec(id, pub string, lo, hi uint16, start time.Time) store.LeaseRecord {
	return store.LeaseRecord{ID: id, JobID: "job-" + id, Token: "t", Gateway: "gw1:8443",
		TunnelAddrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, Egress: []store.Attribution{{Addr: netip.MustParseAddr(pub), PortLo: lo, PortHi: hi}}, Start: start,
		Resume: &store.ResumeState{SecretHash: []byte("secret"), Block: 1}}
}

func testWhois(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "gw1")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.RecordLeaseStart(rec("a", "203.0.113.1", 20000, 20255, t0)))
	must(s.RecordLeaseEnd("a", t0.Add(time.Hour), "released"))
	must(s.RecordLeaseStart(rec("b", "203.0.113.1", 20000, 20255, t0.Add(2*time.Hour))))
	must(s.RecordLeaseStart(rec("c", "0.0.0.0", 30000, 30255, t0)))
	own := rec("d", "203.0.113.1", 20256, 20511, t0)
	own.Egress = append(own.Egress, store.Attribution{Addr: netip.MustParseAddr("2001:db8:1::64:2"), Own: true})
	must(s.RecordLeaseStart(own))
	v6 := rec("e", "203.0.113.1", 20512, 20767, t0)
	v6.Egress = append(v6.Egress, store.Attribution{Addr: netip.MustParseAddr("2001:db8::1"), PortLo: 20512, PortHi: 20767})
	must(s.RecordLeaseStart(v6))
	for _, tc := range []struct {
		addr string
		port uint16
		at   time.Time
		want []string
	}{
		{"203.0.113.1", 20100, t0.Add(30 * time.Minute), []string{"a"}},
		{"203.0.113.1", 20255, t0.Add(90 * time.Minute), nil},
		{"203.0.113.1", 20000, t0.Add(3 * time.Hour), []string{"b"}},
		{"203.0.113.1", 20256, t0.Add(time.Minute), []string{"d"}},
		{"203.0.113.9", 30001, t0.Add(time.Minute), []string{"c"}},
		{"::ffff:203.0.113.9", 30001, t0.Add(time.Minute), []string{"c"}},
		{"2001:db8:1::64:2", 1, t0.Add(time.Minute), []string{"d"}},
		{"2001:db8::1", 20600, t0.Add(time.Minute), []string{"e"}},
		{"2001:db8::1", 20000, t0.Add(time.Minute), nil},
		{"203.0.113.1", 20100, t0.Add(-time.Minute), nil},
	} {
		got, err := s.Whois(netip.MustParseAddr(tc.addr), tc.port, tc.at)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range got {
			ids = append(ids, r.ID)
			if r.Resume != nil {
				t.Errorf("whois %s: resume state in the shared database", r.ID)
			}
		}
		if len(ids) != len(tc.want) || len(ids) > 0 && ids[0] != tc.want[0] {
			t.Errorf("whois %s:%d at %s: got %v, want %v", tc.addr, tc.port, tc.at.Sub(t0), ids, tc.want)
		}
	}
	live, err := s.ActiveLeases()
	if err != nil || len(live) != 4 {
		t.Fatalf("active: got %d %v, want 4", len(live), err)
	}
}

func testPutLeases(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "gw1")
	t0 := time.Now().Truncate(time.Second)
	start := rec("a", "203.0.113.1", 20000, 20255, t0)
	end := start
	end.End, end.EndReason = t0.Add(time.Minute), "expired"
	// A journal replays at least once, in order: start, end, then (after
	// a crash before its trim) start and end again.
	if err := s.PutLeases([]store.LeaseRecord{start, end, start}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLeases([]store.LeaseRecord{end}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Lease("a")
	if err != nil || !r.End.Equal(end.End) || r.EndReason != "expired" {
		t.Fatalf("lease: got %+v %v, want ended (expired)", r, err)
	}
	if live, _ := s.ActiveLeases(); len(live) != 0 {
		t.Fatalf("active after end: got %d, want 0", len(live))
	}
}

func testPrune(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "gw1")
	t0 := time.Now().Add(-500 * 24 * time.Hour)
	old := rec("old", "203.0.113.1", 20000, 20255, t0)
	old.End, old.EndReason = t0.Add(time.Hour), "released"
	live := rec("live", "203.0.113.1", 20256, 20511, t0)
	if err := s.PutLeases([]store.LeaseRecord{old, live}); err != nil {
		t.Fatal(err)
	}
	n, err := s.PruneLeases(time.Now().Add(-400 * 24 * time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("prune: got %d %v, want 1", n, err)
	}
	if got, _ := s.Whois(old.Egress[0].Addr, 20000, t0.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("whois after prune: got %d, want 0", len(got))
	}
	h, err := s.HistoryStats()
	if err != nil || h.Leases != 1 || h.Live != 1 || h.Bytes == 0 {
		t.Fatalf("history stats: got %+v %v", h, err)
	}
}

func testNotify(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "gw1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan pgstore.Notification, 10)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- s.Listen(ctx, func() { close(ready) }, func(n pgstore.Notification) { got <- n }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	if _, _, err := s.CreateToken("n1", 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeToken("n1"); err != nil {
		t.Fatal(err)
	}
	ban, err := s.AddBan(store.Ban{Token: "n1", Host: "h", Until: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	want := []pgstore.Notification{
		{Table: "airlock_tokens", Op: "INSERT", Key: "n1"},
		{Table: "airlock_tokens", Op: "DELETE", Key: "n1"},
		{Table: "airlock_bans", Op: "INSERT", Key: itoa(ban.ID)},
	}
	for _, w := range want {
		select {
		case n := <-got:
			if n != w {
				t.Fatalf("notification: got %+v, want %+v", n, w)
			}
		case <-time.After(time.Second):
			t.Fatalf("no notification %+v within 1s", w)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("listen after cancel: %v", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func testTLS(t *testing.T, c *pgtest.Cluster) {
	db := c.CreateDB(t)
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte(pgtest.Password+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := pgstore.Config{URL: c.TCPURL(pgtest.Superuser, db), PasswordFile: pw}
	ctx := context.Background()
	if _, _, err := pgstore.Migrate(ctx, cfg); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("password file 0644: got %v, want a refusal naming chmod 600", err)
	}
	os.Chmod(pw, 0o600)
	if _, _, err := pgstore.Migrate(ctx, cfg); err != nil {
		t.Fatalf("migrate over TLS with a password file: %v", err)
	}
	s, err := pgstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.CreateToken("tls", 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A wrong password, and a server certificate that is not the pinned
	// root, are refused.
	os.WriteFile(pw, []byte("wrong\n"), 0o600)
	if _, err := pgstore.Open(ctx, cfg); err == nil {
		t.Fatal("wrong password accepted")
	}
	os.WriteFile(pw, []byte(pgtest.Password+"\n"), 0o600)
	bad := cfg
	bad.URL = c.TCPURL(pgtest.Superuser, db) + "x" // sslrootcert names a file that does not exist
	if _, err := pgstore.Open(ctx, bad); err == nil {
		t.Fatal("open with a missing root certificate succeeded")
	}
	other := filepath.Join(dir, "other.crt")
	writeOtherCA(t, other)
	bad.URL = "postgres://" + pgtest.Superuser + "@127.0.0.1:" + itoa(int64(c.Port)) + "/" + db + "?sslmode=verify-full&sslrootcert=" + other
	if _, err := pgstore.Open(ctx, bad); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("open with a server certificate that is not the pinned root: got %v, want a certificate error", err)
	}
}

// writeOtherCA writes a self-signed certificate of another server for
// 127.0.0.1 to path.
func writeOtherCA(t *testing.T, path string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "other"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, BasicConstraintsValid: true, IsCA: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
}

func testMembers(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "")
	for _, m := range []store.Member{
		{ID: "sha256:b", Advertise: "gw2:8443", Jobs: 3, Capacity: 100},
		{ID: "sha256:a", Advertise: "gw1:8443", Capacity: 50, Draining: true},
	} {
		if err := s.Heartbeat(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Heartbeat(store.Member{ID: "sha256:b", Advertise: "gw2:8443", Jobs: 4, Capacity: 100}); err != nil {
		t.Fatal(err)
	}
	ms, err := s.Members()
	if err != nil || len(ms) != 2 || ms[0].Advertise != "gw1:8443" || ms[1].Jobs != 4 || ms[1].Heartbeat.IsZero() {
		t.Fatalf("members: got %+v %v", ms, err)
	}
	now, err := s.Now()
	if err != nil || !ms[1].Alive(now, 10*time.Second) {
		t.Fatalf("member not alive at the database's now %v: %+v %v", now, ms[1], err)
	}
}

func testKicks(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "")
	id, err := s.RequestKick(pgstore.Kick{Lease: "l1", Gateway: "sha256:a", Reason: "abuse"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.PendingKick(id, "sha256:b"); ok {
		t.Fatal("another gateway sees the kick as its own")
	}
	k, ok, err := s.PendingKick(id, "sha256:a")
	if err != nil || !ok || k.Lease != "l1" || k.Reason != "abuse" {
		t.Fatalf("pending: got %+v %v %v", k, ok, err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		s.FinishKick(id, pgstore.KickResult{Ended: true})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := s.WaitKick(ctx, id)
	if err != nil || !res.Ended {
		t.Fatalf("wait kick: got %+v %v", res, err)
	}
	if ks, _ := s.PendingKicks("sha256:a"); len(ks) != 0 {
		t.Fatalf("pending after finish: %+v", ks)
	}
}

func TestURLHasPassword(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want bool
	}{
		{"postgres://gw@db/airlock", false},
		{"postgres://gw:secret@db/airlock", true},
		{"postgresql://gw@db/airlock?password=secret", true},
		{"host=db user=gw dbname=airlock", false},
		{"host=db user=gw password=secret", true},
	} {
		if got := pgstore.URLHasPassword(tc.url); got != tc.want {
			t.Errorf("URLHasPassword(%q) = %v, want %v", tc.url, got, tc.want)
		}
		if r := pgstore.Redact(tc.url); strings.Contains(r, "secret") || pgstore.URLHasPassword(r) {
			t.Errorf("Redact(%q) = %q, still with the password", tc.url, r)
		}
	}
}

// testCaptureTickets: a ticket is taken once, by its gateway, with its
// secret, before it expires; every other attempt is ErrNotFound alike.
func testCaptureTickets(t *testing.T, c *pgtest.Cluster) {
	s, _ := open(t, c, "")
	hash := func(secret string) []byte { h := sha256.Sum256([]byte(secret)); return h[:] }
	want := pgstore.Capture{Lease: "l1", Gateway: "gw-b", Job: "42", Filter: "tcp port 80", Snaplen: 96, By: "test"}
	id, err := s.RequestCapture(want, hash("right"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		what, gw, secret string
		id               int64
	}{
		{"wrong secret", "gw-b", "wrong", id},
		{"another gateway", "gw-a", "right", id},
		{"unknown ticket", "gw-b", "right", id + 100},
	} {
		if _, err := s.TakeCapture(bad.id, bad.gw, hash(bad.secret)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("take with %s: got %v, want ErrNotFound", bad.what, err)
		}
	}
	got, err := s.TakeCapture(id, "gw-b", hash("right"))
	want.ID = id
	if err != nil || got != want {
		t.Fatalf("take: got %+v %v, want %+v", got, err, want)
	}
	if _, err := s.TakeCapture(id, "gw-b", hash("right")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("take twice: got %v, want ErrNotFound", err)
	}
	short, err := s.RequestCapture(want, hash("right"), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if _, err := s.TakeCapture(short, "gw-b", hash("right")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("take an expired ticket: got %v, want ErrNotFound", err)
	}
}
