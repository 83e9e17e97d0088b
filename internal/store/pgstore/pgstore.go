// SPDX-License-Identifier: MIT

// Package pgstore keeps Airlock's shared state in PostgreSQL, for a fleet of
// gateways that acts as one site: join tokens, bans and the lease history
// (with its attribution index, which answers whois for any gateway's
// address), the fleet's members and kick requests. It implements
// [store.DB]; internal/fleet puts a local replica and journal in front of it
// so that a gateway does not depend on the database for its data path.
//
// The schema is versioned (migrations/, applied by Migrate: a version
// table, each migration in one transaction under an advisory lock;
// migrate.go). Migrations only add, so that gateways keep running while
// one is applied; Open refuses a schema older than this code (run airlock
// db migrate) or newer (upgrade this gateway).
//
// Changes to tokens, bans and kicks are announced by triggers on the
// channel "airlock" (NOTIFY, sent at commit); Listen delivers them.
//
// Every method is bounded by Config.Timeout. A Store is safe for
// concurrent use.
package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/airlock-vpn/airlock/internal/store"
)

// VersionTable is the table that holds the schema version.
const VersionTable = "airlock_schema_version"

// DefaultTimeout bounds each call when Config.Timeout is zero.
const DefaultTimeout = 5 * time.Second

// Errors of Open about the schema.
var (
	// ErrSchemaOld means the database's schema is older than this code
	// knows (or absent): run airlock db migrate.
	ErrSchemaOld = errors.New("database schema is older than this airlock")
	// ErrSchemaNew means the database's schema is newer than this code
	// knows: upgrade airlock on this host.
	ErrSchemaNew = errors.New("database schema is newer than this airlock")
)

// Config configures Open and Migrate.
type Config struct {
	// URL is a PostgreSQL connection string (postgres://… or key=value),
	// with TLS settings (sslmode, sslrootcert, sslcert, sslkey) as libpq
	// takes them. The password should not be in it: PasswordFile, or
	// PGPASSWORD / PGPASSFILE in the environment.
	URL string
	// PasswordFile, if set, is a file (mode 0600 or stricter) whose first
	// line is the password.
	PasswordFile string
	// Gateway is this gateway's member id: ActiveLeases returns its
	// leases. Empty for admin commands.
	Gateway string
	// Timeout bounds each call; 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxConns bounds the connection pool; 0 means 4.
	MaxConns int32
	// Insecure allows a TCP connection whose server is not verified by
	// TLS (sslmode other than verify-full or verify-ca): --store-insecure,
	// for a path to the database that the site trusts (transport.go).
	Insecure bool
	Logger   *slog.Logger
}

// Store is the shared state in PostgreSQL. It is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	cfg     Config
	timeout time.Duration
}

var _ store.DB = (*Store)(nil)

// poolConfig parses cfg into a pool configuration.
func poolConfig(cfg Config) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("parse --store: %w", redact(err))
	}
	if err := checkTransport(&pc.ConnConfig.Config, cfg.Insecure); err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	if cfg.PasswordFile != "" {
		pw, err := readPasswordFile(cfg.PasswordFile)
		if err != nil {
			return nil, err
		}
		pc.ConnConfig.Password = pw
	}
	pc.MaxConns = cfg.MaxConns
	if pc.MaxConns <= 0 {
		pc.MaxConns = 4
	}
	pc.ConnConfig.ConnectTimeout = timeout(cfg)
	pc.ConnConfig.RuntimeParams["application_name"] = "airlock"
	return pc, nil
}

func timeout(cfg Config) time.Duration {
	if cfg.Timeout > 0 {
		return cfg.Timeout
	}
	return DefaultTimeout
}

// readPasswordFile returns the first line of path, refusing a file that
// others may read.
func readPasswordFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("database password file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("database password file %s has mode %04o: others may read it; chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("database password file: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimRight(line, "\r")
	if line == "" {
		return "", fmt.Errorf("database password file %s is empty", path)
	}
	return line, nil
}

// URLHasPassword reports whether a connection string carries a password
// itself (postgres://USER:PASSWORD@… or password=…).
func URLHasPassword(connString string) bool {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		_, set := u.User.Password()
		return set || u.Query().Get("password") != ""
	}
	for _, f := range strings.Fields(connString) {
		if strings.HasPrefix(f, "password=") {
			return true
		}
	}
	return false
}

// Redact returns a connection string without its password, to show.
func Redact(connString string) string {
	if u, err := url.Parse(connString); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if _, set := u.User.Password(); set {
			u.User = url.User(u.User.Username())
		}
		q := u.Query()
		if q.Has("password") {
			q.Del("password")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	var out []string
	for _, f := range strings.Fields(connString) {
		if !strings.HasPrefix(f, "password=") {
			out = append(out, f)
		}
	}
	return strings.Join(out, " ")
}

// redact drops the connection string from pgx's parse errors, which
// quote it (with any password in it).
func redact(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s", strings.ReplaceAll(pe.Error(), pe.ConnString, "…"))
	}
	return err
}

// Open connects to the database and checks that its schema is the one
// this code knows.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	s, err := OpenLazy(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.CheckSchema(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// OpenLazy is Open without the schema check: it does not connect, so it
// succeeds while the database is unreachable (a gateway that starts during
// an outage). Check with CheckSchema once it answers.
func OpenLazy(cfg Config) (*Store, error) {
	pc, err := poolConfig(cfg)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return &Store{pool: pool, cfg: cfg, timeout: timeout(cfg)}, nil
}

// CheckSchema returns nil if the database's schema is the one this code
// knows, an error wrapping ErrSchemaOld or ErrSchemaNew if not, and the
// connection's error if the database cannot be reached.
func (s *Store) CheckSchema(ctx context.Context) error {
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	latest := LatestVersion()
	switch {
	case v < latest:
		return fmt.Errorf("%w: it is at version %d, this airlock needs %d; run airlock db migrate --store URL (as the schema's owner)", ErrSchemaOld, v, latest)
	case v > latest:
		return fmt.Errorf("%w: it is at version %d, this airlock knows %d; upgrade airlock on this host to the fleet's version", ErrSchemaNew, v, latest)
	}
	return nil
}

// Close closes the connection pool.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// call returns a context bounded by the store's timeout.
func (s *Store) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

// SchemaVersion returns the database's schema version, 0 if it has none.
func (s *Store) SchemaVersion(ctx context.Context) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var v int32
	err := s.pool.QueryRow(ctx, "select version from "+VersionTable).Scan(&v)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", tlsFailure(err))
	}
	return v, nil
}

// denied wraps err with store.ErrNotPermitted when the database refused
// it for want of a privilege (or by row-level security), saying what to
// do: what is an admin's work, on an admin host, as a member of
// AdminRole.
func denied(err error, what string) error {
	if !pgErr(err, "42501") { // insufficient_privilege
		return err
	}
	return fmt.Errorf("%w: the database refuses to %s to this role (%w); that is an admin's work: run it on an admin host with --store and a role of %s (airlock db migrate --admin-role, docs/fleet.md)",
		store.ErrNotPermitted, what, err, AdminRole)
}

// pgErr reports whether err is a PostgreSQL error with code.
func pgErr(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// CreateToken implements store.DB.
func (s *Store) CreateToken(name string, ttl time.Duration, now time.Time) (string, store.Token, error) {
	secret, err := store.NewTokenSecret()
	if err != nil {
		return "", store.Token{}, fmt.Errorf("create token: %w", err)
	}
	t, err := s.storeToken(name, secret, ttl, now)
	if err != nil {
		return "", store.Token{}, fmt.Errorf("create token: %w", denied(err, "create tokens"))
	}
	return secret, t, nil
}

// ImportToken implements store.DB.
func (s *Store) ImportToken(name, secret string, ttl time.Duration, now time.Time) (store.Token, error) {
	secret, err := store.CheckTokenSecret(secret)
	if err != nil {
		return store.Token{}, fmt.Errorf("import token: %w", err)
	}
	t, err := s.storeToken(name, secret, ttl, now)
	if err != nil {
		return store.Token{}, fmt.Errorf("import token: %w", denied(err, "create tokens"))
	}
	return t, nil
}

func (s *Store) storeToken(name, secret string, ttl time.Duration, now time.Time) (store.Token, error) {
	if ttl < 0 {
		return store.Token{}, fmt.Errorf("negative ttl %s", ttl)
	}
	if name != "" {
		if err := store.ValidateTokenName(name); err != nil {
			return store.Token{}, err
		}
	}
	t := store.Token{Name: name, Hash: store.HashToken(secret), Created: now.UTC().Truncate(time.Microsecond)}
	if ttl > 0 {
		t.Expires = now.Add(ttl).UTC().Truncate(time.Microsecond)
	}
	ctx, cancel := s.call()
	defer cancel()
	for i := 0; ; i++ {
		if name == "" {
			n, err := store.GenerateTokenName()
			if err != nil {
				return store.Token{}, err
			}
			t.Name = n
		}
		rec, err := json.Marshal(t)
		if err != nil {
			return store.Token{}, err
		}
		var exp *time.Time
		if !t.Expires.IsZero() {
			exp = &t.Expires
		}
		_, err = s.pool.Exec(ctx, "insert into airlock_tokens (name, hash, created, expires, record) values ($1, $2, $3, $4, $5)",
			t.Name, t.Hash, t.Created, exp, rec)
		if pgErr(err, "23505") { // unique_violation
			var pe *pgconn.PgError
			errors.As(err, &pe)
			if strings.Contains(pe.ConstraintName, "hash") {
				return store.Token{}, fmt.Errorf("this token is already stored: %w", store.ErrExists)
			}
			if name == "" && i < 16 {
				continue
			}
			return store.Token{}, fmt.Errorf("token %q: %w", t.Name, store.ErrExists)
		}
		if err != nil {
			return store.Token{}, err
		}
		return t, nil
	}
}

// Tokens implements store.DB.
func (s *Store) Tokens() ([]store.Token, error) {
	ctx, cancel := s.call()
	defer cancel()
	rows, err := s.pool.Query(ctx, "select record from airlock_tokens order by name")
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	toks, err := pgx.CollectRows(rows, pgx.RowTo[store.Token])
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return toks, nil
}

// RestrictToken implements store.DB.
func (s *Store) RestrictToken(name string, r store.TokenRestrictions) (store.Token, error) {
	if err := r.Validate(); err != nil {
		return store.Token{}, fmt.Errorf("restrict token %q: %w", store.Truncate(name), err)
	}
	ctx, cancel := s.call()
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return store.Token{}, fmt.Errorf("restrict token: %w", err)
	}
	defer tx.Rollback(ctx)
	var t store.Token
	err = denied(tx.QueryRow(ctx, "select record from airlock_tokens where name = $1 for update", name).Scan(&t), "change tokens")
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Token{}, fmt.Errorf("restrict token: token %q: %w", store.Truncate(name), store.ErrNotFound)
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("restrict token: %w", err)
	}
	t.From, t.Attest = r.From, r.Attest
	rec, err := json.Marshal(t)
	if err != nil {
		return store.Token{}, err
	}
	if _, err := tx.Exec(ctx, "update airlock_tokens set record = $2 where name = $1", name, rec); err != nil {
		return store.Token{}, fmt.Errorf("restrict token: %w", denied(err, "change tokens"))
	}
	if err := tx.Commit(ctx); err != nil {
		return store.Token{}, fmt.Errorf("restrict token: %w", err)
	}
	t.Hash = nil
	return t, nil
}

// Token implements store.DB.
func (s *Store) Token(name string) (store.Token, error) {
	ctx, cancel := s.call()
	defer cancel()
	var t store.Token
	err := s.pool.QueryRow(ctx, "select record from airlock_tokens where name = $1", name).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Token{}, fmt.Errorf("token %q: %w", store.Truncate(name), store.ErrNotFound)
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("read token %q: %w", store.Truncate(name), err)
	}
	t.Hash = nil
	return t, nil
}

// RevokeToken implements store.DB: the row goes, and the trigger tells
// every gateway.
func (s *Store) RevokeToken(name string) error {
	ctx, cancel := s.call()
	defer cancel()
	tag, err := s.pool.Exec(ctx, "delete from airlock_tokens where name = $1", name)
	if err != nil {
		return fmt.Errorf("revoke token: %w", denied(err, "revoke tokens"))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("revoke token: token %q: %w", store.Truncate(name), store.ErrNotFound)
	}
	return nil
}

// VerifyToken implements store.DB (a fleet gateway verifies against its
// local replica instead, internal/fleet).
func (s *Store) VerifyToken(secret string, now time.Time) (store.Token, error) {
	if !strings.HasPrefix(secret, store.TokenPrefix) {
		return store.Token{}, fmt.Errorf("verify token: %w: not an airlock token", store.ErrBadToken)
	}
	ctx, cancel := s.call()
	defer cancel()
	var t store.Token
	err := s.pool.QueryRow(ctx, "select record from airlock_tokens where hash = $1", store.HashToken(secret)).Scan(&t)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Token{}, fmt.Errorf("verify token: %w: unknown or revoked token", store.ErrBadToken)
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("verify token: %w", err)
	}
	if t.Expired(now) {
		return store.Token{}, fmt.Errorf("verify token %q: %w: %w at %s", t.Name, store.ErrBadToken, store.ErrTokenExpired, t.Expires.Format(time.RFC3339))
	}
	return t, nil
}

// AddBan implements store.DB.
func (s *Store) AddBan(b store.Ban) (store.Ban, error) {
	if err := b.Valid(); err != nil {
		return store.Ban{}, fmt.Errorf("add ban: %w", err)
	}
	ctx, cancel := s.call()
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return store.Ban{}, fmt.Errorf("add ban: %w", err)
	}
	defer tx.Rollback(context.Background())
	if err := tx.QueryRow(ctx, "select nextval('airlock_bans_id_seq')").Scan(&b.ID); err != nil {
		return store.Ban{}, fmt.Errorf("add ban: %w", err)
	}
	rec, err := json.Marshal(b)
	if err != nil {
		return store.Ban{}, err
	}
	if _, err := tx.Exec(ctx, "insert into airlock_bans (id, until, record) values ($1, $2, $3)", b.ID, b.Until, rec); err != nil {
		return store.Ban{}, fmt.Errorf("add ban: %w", err)
	}
	if _, err := tx.Exec(ctx, "delete from airlock_bans where until < now() - interval '1 day'"); err != nil {
		return store.Ban{}, fmt.Errorf("add ban: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return store.Ban{}, fmt.Errorf("add ban: %w", err)
	}
	return b, nil
}

// Bans implements store.DB.
func (s *Store) Bans(now time.Time) ([]store.Ban, error) {
	ctx, cancel := s.call()
	defer cancel()
	rows, err := s.pool.Query(ctx, "select record from airlock_bans where until > $1 order by id", now)
	if err != nil {
		return nil, fmt.Errorf("list bans: %w", err)
	}
	bans, err := pgx.CollectRows(rows, pgx.RowTo[store.Ban])
	if err != nil {
		return nil, fmt.Errorf("list bans: %w", err)
	}
	return bans, nil
}

// gatewayOf is the member id a record belongs to.
func (s *Store) gatewayOf(r store.LeaseRecord) string {
	if s.cfg.Gateway != "" {
		return s.cfg.Gateway
	}
	return r.Gateway
}

// RecordLeaseStart implements store.DB. It is idempotent, and it never
// reopens a record that has an end: a journal replays snapshots in order,
// but at least once.
func (s *Store) RecordLeaseStart(r store.LeaseRecord) error {
	if r.ID == "" {
		return fmt.Errorf("record lease: empty id")
	}
	return s.PutLeases([]store.LeaseRecord{r})
}

// PutLeases writes snapshots of lease records (a start, or an end) in one
// transaction, in order: a record is created, or, while it has no end,
// replaced, with its attribution rows. A record that already has an end
// is left alone. Resume state is not written.
func (s *Store) PutLeases(recs []store.LeaseRecord) error {
	ctx, cancel := s.call()
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("record leases: %w", err)
	}
	defer tx.Rollback(context.Background())
	span := -1
	for _, r := range recs {
		r.Resume = nil
		rec, err := json.Marshal(r)
		if err != nil {
			return err
		}
		var end *time.Time
		if !r.End.IsZero() {
			end = &r.End
		}
		_, err = tx.Exec(ctx, `insert into airlock_leases (id, gateway, start, "end", record) values ($1, $2, $3, $4, $5)
			on conflict (id) do update set "end" = excluded."end", record = excluded.record, writer = current_user where airlock_leases."end" is null`,
			r.ID, s.gatewayOf(r), r.Start, end, rec)
		if err != nil {
			return fmt.Errorf("record lease %s: %w", r.ID, denied(err, "change another gateway's lease record"))
		}
		for _, a := range store.Attributions(r) {
			_, err = tx.Exec(ctx, `insert into airlock_attribution (lease_id, public_addr, port_lo, port_hi, own, start)
				values ($1, $2, $3, $4, $5, $6) on conflict do nothing`, r.ID, a.Addr, int(a.PortLo), int(a.PortHi), a.Own, r.Start)
			if err != nil {
				return fmt.Errorf("record lease %s: %w", r.ID, err)
			}
			if !a.Own {
				span = max(span, int(a.PortHi)-int(a.PortLo))
			}
		}
	}
	if span >= 0 {
		_, err = tx.Exec(ctx, `insert into airlock_meta (key, value) values ('max_block_span', $1)
			on conflict (key) do update set value = greatest(airlock_meta.value, excluded.value)`, span)
		if err != nil {
			return fmt.Errorf("record leases: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("record leases: %w", err)
	}
	return nil
}

// RecordLeaseEnd implements store.DB.
func (s *Store) RecordLeaseEnd(id string, end time.Time, reason string) error {
	ctx, cancel := s.call()
	defer cancel()
	var r store.LeaseRecord
	err := s.pool.QueryRow(ctx, "select record from airlock_leases where id = $1", id).Scan(&r)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("record end of lease %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("record end of lease %s: %w", id, err)
	}
	if !r.End.IsZero() {
		return nil
	}
	r.End, r.EndReason = end, reason
	return s.PutLeases([]store.LeaseRecord{r})
}

// ActiveLeases implements store.DB: the live leases of Config.Gateway.
func (s *Store) ActiveLeases() ([]store.LeaseRecord, error) {
	return s.LiveLeases(s.cfg.Gateway)
}

// LiveLeases returns the records without an end of gateway id (every
// gateway's if id is empty), oldest first.
func (s *Store) LiveLeases(id string) ([]store.LeaseRecord, error) {
	ctx, cancel := s.call()
	defer cancel()
	rows, err := s.pool.Query(ctx, `select record from airlock_leases where "end" is null and ($1 = '' or gateway = $1) order by start`, id)
	if err != nil {
		return nil, fmt.Errorf("live leases: %w", err)
	}
	recs, err := pgx.CollectRows(rows, pgx.RowTo[store.LeaseRecord])
	if err != nil {
		return nil, fmt.Errorf("live leases: %w", err)
	}
	return recs, nil
}

// LiveLeasesByMember returns the records without an end by the member id
// of the gateway that recorded them, oldest first.
func (s *Store) LiveLeasesByMember() (map[string][]store.LeaseRecord, error) {
	ctx, cancel := s.call()
	defer cancel()
	rows, err := s.pool.Query(ctx, `select gateway, record from airlock_leases where "end" is null order by start`)
	if err != nil {
		return nil, fmt.Errorf("live leases: %w", err)
	}
	out := map[string][]store.LeaseRecord{}
	var gw string
	var r store.LeaseRecord
	_, err = pgx.ForEachRow(rows, []any{&gw, &r}, func() error {
		out[gw] = append(out[gw], r)
		r = store.LeaseRecord{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("live leases: %w", err)
	}
	return out, nil
}

// Lease returns the record of lease id.
func (s *Store) Lease(id string) (store.LeaseRecord, error) {
	ctx, cancel := s.call()
	defer cancel()
	var r store.LeaseRecord
	err := s.pool.QueryRow(ctx, "select record from airlock_leases where id = $1", id).Scan(&r)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("lease %s: %w", id, err)
	}
	return r, nil
}

// LeaseMember returns the member id of the gateway that recorded lease id.
func (s *Store) LeaseMember(id string) (string, error) {
	ctx, cancel := s.call()
	defer cancel()
	var gw string
	err := s.pool.QueryRow(ctx, "select gateway from airlock_leases where id = $1", id).Scan(&gw)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("lease %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("lease %s: %w", id, err)
	}
	return gw, nil
}

// Whois implements store.DB: records whose attribution row names addr
// with port in its block (or addr alone, own), or the unspecified address
// of addr's family with port in its block, and that covered at.
func (s *Store) Whois(addr netip.Addr, port uint16, at time.Time) ([]store.LeaseRecord, error) {
	addr = addr.Unmap()
	unspec := netip.IPv6Unspecified()
	if addr.Is4() {
		unspec = netip.IPv4Unspecified()
	}
	ctx, cancel := s.call()
	defer cancel()
	// Blocks start at most max_block_span below the port: an index range
	// of (address, first port) whatever the history's length.
	rows, err := s.pool.Query(ctx, `with span as (select coalesce((select value from airlock_meta where key = 'max_block_span'), 65535)::integer as s)
		select l.record from airlock_leases l where l.id in (
			select a.lease_id from airlock_attribution a, span
			 where a.public_addr in ($1, $3) and not a.own and a.port_lo between greatest($2 - span.s, 0) and $2
			   and a.port_hi >= $2 and a.start <= $4
			union
			select a.lease_id from airlock_attribution a
			 where a.public_addr = $1 and a.port_lo = 0 and a.own and a.start <= $4)
		  and (l."end" is null or l."end" > $4)`, addr, int(port), unspec, at)
	if err != nil {
		return nil, fmt.Errorf("whois %s:%d: %w", addr, port, err)
	}
	recs, err := pgx.CollectRows(rows, pgx.RowTo[store.LeaseRecord])
	if err != nil {
		return nil, fmt.Errorf("whois %s:%d: %w", addr, port, err)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Start.After(recs[j].Start) })
	return recs, nil
}

// PruneLeases implements store.DB. Every gateway of a fleet runs it; the
// deletes are idempotent.
func (s *Store) PruneLeases(cutoff time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*s.timeout)
	defer cancel()
	tag, err := s.pool.Exec(ctx, `delete from airlock_leases where "end" < $1`, cutoff)
	if err != nil {
		return 0, fmt.Errorf("prune leases: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// HistoryStats describes what the lease history keeps.
type HistoryStats struct {
	Leases int64     `json:"leases"`
	Live   int64     `json:"live"`
	Oldest time.Time `json:"oldest,omitzero"`
	// Bytes is the size of the history's tables and indexes.
	Bytes int64 `json:"bytes"`
}

// HistoryStats returns how much the lease history holds.
func (s *Store) HistoryStats() (HistoryStats, error) {
	ctx, cancel := s.call()
	defer cancel()
	var h HistoryStats
	var oldest *time.Time
	err := s.pool.QueryRow(ctx, `select count(*), count(*) filter (where "end" is null), min(start),
		pg_total_relation_size('airlock_leases') + pg_total_relation_size('airlock_attribution') from airlock_leases`).Scan(&h.Leases, &h.Live, &oldest, &h.Bytes)
	if err != nil {
		return h, fmt.Errorf("history stats: %w", err)
	}
	if oldest != nil {
		h.Oldest = *oldest
	}
	return h, nil
}

// Heartbeat registers or updates member m (its Heartbeat is set by the
// database's clock).
func (s *Store) Heartbeat(m store.Member) error {
	ctx, cancel := s.call()
	defer cancel()
	rec, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, `insert into airlock_gateways (id, heartbeat, record) values ($1, now(), $2)
		on conflict (id) do update set heartbeat = now(), record = excluded.record, writer = current_user`, m.ID, rec)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", denied(err, "write another gateway's member record, or a 17th record of its own (a gateway role keeps at most 16: delete its stopped ones)"))
	}
	return nil
}

// Members returns every registered gateway, with Heartbeat from the
// database's clock, by advertised address.
func (s *Store) Members() ([]store.Member, error) {
	ctx, cancel := s.call()
	defer cancel()
	rows, err := s.pool.Query(ctx, "select record, heartbeat from airlock_gateways")
	if err != nil {
		return nil, fmt.Errorf("members: %w", err)
	}
	var out []store.Member
	var m store.Member
	var hb time.Time
	_, err = pgx.ForEachRow(rows, []any{&m, &hb}, func() error {
		m.Heartbeat = hb
		out = append(out, m)
		m = store.Member{}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("members: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Advertise < out[j].Advertise })
	return out, nil
}

// Now returns the database's clock, which heartbeats are compared with.
func (s *Store) Now() (time.Time, error) {
	ctx, cancel := s.call()
	defer cancel()
	var t time.Time
	err := s.pool.QueryRow(ctx, "select now()").Scan(&t)
	return t, err
}

// Kick is an admin's request that the gateway holding a lease end it.
type Kick struct {
	ID      int64  `json:"id,omitempty"`
	Lease   string `json:"lease"`
	Gateway string `json:"gateway"`
	Reason  string `json:"reason,omitempty"`
	// Ban, if positive, also bans the job's token from its host.
	Ban time.Duration `json:"ban,omitempty"`
	By  string        `json:"by,omitempty"`
}

// KickResult is the holding gateway's answer.
type KickResult struct {
	Ended bool   `json:"ended"`
	Error string `json:"error,omitempty"`
}

// RequestKick stores k; the trigger tells every gateway, and the one that
// holds the lease ends it and answers with FinishKick.
func (s *Store) RequestKick(k Kick) (int64, error) {
	ctx, cancel := s.call()
	defer cancel()
	rec, err := json.Marshal(k)
	if err != nil {
		return 0, err
	}
	var id int64
	err = s.pool.QueryRow(ctx, "insert into airlock_kicks (lease_id, gateway, record) values ($1, $2, $3) returning id", k.Lease, k.Gateway, rec).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("request kick: %w", err)
	}
	return id, nil
}

// PendingKick returns kick request id if it is for gateway gw and not done.
func (s *Store) PendingKick(id int64, gw string) (Kick, bool, error) {
	ctx, cancel := s.call()
	defer cancel()
	var k Kick
	err := s.pool.QueryRow(ctx, "select record from airlock_kicks where id = $1 and gateway = $2 and done is null", id, gw).Scan(&k)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, false, nil
	}
	if err != nil {
		return k, false, fmt.Errorf("kick %d: %w", id, err)
	}
	k.ID = id
	return k, true, nil
}

// PendingKicks returns the kick requests for gateway gw not done yet.
func (s *Store) PendingKicks(gw string) ([]Kick, error) {
	ctx, cancel := s.call()
	defer cancel()
	rows, err := s.pool.Query(ctx, "select id, record from airlock_kicks where gateway = $1 and done is null order by id", gw)
	if err != nil {
		return nil, fmt.Errorf("pending kicks: %w", err)
	}
	var out []Kick
	var id int64
	var k Kick
	_, err = pgx.ForEachRow(rows, []any{&id, &k}, func() error {
		k.ID = id
		out = append(out, k)
		k = Kick{}
		return nil
	})
	return out, err
}

// FinishKick records the answer to kick request id.
func (s *Store) FinishKick(id int64, res KickResult) error {
	ctx, cancel := s.call()
	defer cancel()
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = s.pool.Exec(ctx, "update airlock_kicks set done = now(), result = $2 where id = $1", id, b)
	if err != nil {
		return fmt.Errorf("finish kick %d: %w", id, err)
	}
	return nil
}

// WaitKick waits until kick request id is answered or ctx ends.
func (s *Store) WaitKick(ctx context.Context, id int64) (KickResult, error) {
	for {
		var res *KickResult
		qctx, cancel := context.WithTimeout(ctx, s.timeout)
		err := s.pool.QueryRow(qctx, "select result from airlock_kicks where id = $1 and done is not null", id).Scan(&res)
		cancel()
		if err == nil && res != nil {
			return *res, nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return KickResult{}, fmt.Errorf("kick %d: %w", id, err)
		}
		select {
		case <-ctx.Done():
			return KickResult{}, fmt.Errorf("kick %d: no answer from the gateway that holds the lease: %w", id, context.Cause(ctx))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Notification is one change announced on channel airlock.
type Notification struct {
	// Table is airlock_tokens, airlock_bans or airlock_kicks; Op is
	// INSERT, UPDATE or DELETE; Key the token's name, or the ban's or
	// kick's id.
	Table string `json:"t"`
	Op    string `json:"op"`
	Key   string `json:"key"`
}

// KickID returns the kick request id of n.
func (n Notification) KickID() (int64, bool) {
	if n.Table != "airlock_kicks" {
		return 0, false
	}
	id, err := strconv.ParseInt(n.Key, 10, 64)
	return id, err == nil
}

// Listen holds one connection that listens on channel airlock, calls
// ready once it listens (the caller reloads what it caches: what changed
// before is not announced), then fn for every notification, until ctx
// ends or the connection fails; it returns the error. Callers loop.
func (s *Store) Listen(ctx context.Context, ready func(), fn func(Notification)) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// The connection will be in LISTEN state: never give it back to the
	// pool.
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "listen airlock"); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	ready()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("listen: %w", err)
		}
		var msg Notification
		if err := json.Unmarshal([]byte(n.Payload), &msg); err != nil {
			continue
		}
		fn(msg)
	}
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.pool.Ping(ctx)
}
