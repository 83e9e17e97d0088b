// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/test/pgtest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// noTLSProxy listens on 127.0.0.1 in front of the real database at
// target and answers every TLS request with PostgreSQL's "N" (no TLS),
// then relays the rest in plain text: what someone on the path to the
// database does to read and answer in its place. It returns its port and
// how many connections asked for TLS.
func noTLSProxy(t *testing.T, target string) (int, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var asked atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				var req [8]byte
				if _, err := io.ReadFull(c, req[:]); err != nil {
					return
				}
				// SSLRequest: length 8, code 80877103.
				if req[4] == 0x04 && req[5] == 0xd2 && req[6] == 0x16 && req[7] == 0x2f {
					asked.Add(1)
					if _, err := c.Write([]byte("N")); err != nil {
						return
					}
				}
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				if req[4] != 0x04 {
					up.Write(req[:])
				}
				go io.Copy(up, c)
				io.Copy(c, up)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, &asked
}

// TestFleetStoreTLS: a gateway refuses a --store URL that reaches the
// database over TCP without verifying its certificate (sslmode=prefer, the
// default, falls back to plain text; require checks nothing) unless
// --store-insecure; and with sslmode=verify-full, a proxy on the path that
// answers "no TLS" stops the gateway at start with an error that says so,
// instead of a start "without the database" that would later trust it.
// Today's main starts in both cases.
func TestFleetStoreTLS(t *testing.T) {
	pgtest.Require(t)
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	if _, _, err := pgstore.Migrate(context.Background(), pgstore.Config{URL: c.URL(pgtest.Superuser, db)}); err != nil {
		t.Fatal(err)
	}
	start := func(sc StoreConfig) error {
		cfg := Config{
			Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
			StateDir: filepath.Join(t.TempDir(), "state"),
			Listen:   "127.0.0.1:0",
			Store:    sc,
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		sg, err := Start(ctx, cfg)
		if err == nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			sg.Stop(sctx)
		}
		return err
	}
	tcp := "postgres://" + pgtest.Superuser + "@127.0.0.1:" + itoaPort(c.Port) + "/" + db
	for _, u := range []string{tcp, tcp + "?sslmode=prefer", tcp + "?sslmode=require", tcp + "?sslmode=disable"} {
		err := start(StoreConfig{URL: u})
		if !errors.Is(err, pgstore.ErrInsecureTransport) || !strings.Contains(err.Error(), "verify-full") || !strings.Contains(err.Error(), "--store-insecure") {
			t.Errorf("gateway with --store %s: %v; want a refusal naming sslmode=verify-full and --store-insecure", u, err)
		}
	}
	// The site's explicit choice is honoured (pgtest's server takes only
	// TLS over TCP, so this gateway starts "without the database", as in
	// an outage: what matters is that the URL is not refused).
	if err := start(StoreConfig{URL: tcp + "?sslmode=disable", Insecure: true}); err != nil {
		t.Errorf("gateway with --store-insecure: %v, want it to start", err)
	}
	// A unix socket is local: allowed.
	if err := start(StoreConfig{URL: c.URL(pgtest.Superuser, db)}); err != nil {
		t.Errorf("gateway on the database's unix socket: %v", err)
	}

	port, asked := noTLSProxy(t, "127.0.0.1:"+itoaPort(c.Port))
	u := "postgres://" + pgtest.Superuser + "@127.0.0.1:" + itoaPort(port) + "/" + db + "?sslmode=verify-full&sslrootcert=" + c.CAFile
	err := start(StoreConfig{URL: u})
	if !errors.Is(err, pgstore.ErrTLSRefused) || !strings.Contains(err.Error(), "refusing the database") {
		t.Errorf("gateway behind a proxy that answers no TLS: %v; want a start refused with ErrTLSRefused", err)
	}
	if asked.Load() == 0 {
		t.Error("the gateway never asked the proxy for TLS")
	}
}

func itoaPort(p int) string { return strconv.Itoa(p) }

// testFleetKey writes a fleet key for t's gateways and returns its file.
func testFleetKey(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet.key")
	if err := fleet.NewKeyFile(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFleetPlantedMember: a member record written into the database with
// a gateway's database password alone (a host of the attacker's, with a
// huge free capacity and a live heartbeat) is never handed to a job, nor
// is a gateway that does not hold the fleet key; the enrolled ones are.
// On today's main the lease lists the planted member.
func TestFleetPlantedMember(t *testing.T) {
	pgtest.Require(t)
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	owner := c.URL(pgtest.Superuser, db)
	if _, _, err := pgstore.MigrateRoles(context.Background(), pgstore.Config{URL: owner},
		pgstore.Roles{Gateways: []string{"plant_a", "plant_b", "plant_c"}, Admins: []string{"plant_ops"}}); err != nil {
		t.Fatal(err)
	}
	key := testFleetKey(t)
	gw := func(role, subnet, key string) *testGateway {
		return startGatewayWith(t, func(cfg *Config) {
			cfg.Store = StoreConfig{URL: c.URL(role, db), FleetKey: key}
			cfg.Subnets = []netip.Prefix{netip.MustParsePrefix(subnet)}
			cfg.RenewInterval, cfg.LeaseTTL = 10*time.Second, 30*time.Second
		})
	}
	a := gw("plant_a", "100.64.0.0/16", key)
	b := gw("plant_b", "100.65.0.0/16", key)
	gw("plant_c", "100.66.0.0/16", "") // not enrolled: no fleet key
	// The attacker holds B's database password.
	conn := c.Connect(t, db)
	if _, err := conn.Exec(context.Background(), "set role plant_b"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(context.Background(), `insert into airlock_gateways (id, heartbeat, record) values ('planted', now() + interval '1 hour',
		'{"id":"planted","advertise":"203.0.113.66:8443","pin":"sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","capacity":1000000,"sig":"bm90IGEgc2lnbmF0dXJl"}')`); err != nil {
		t.Fatalf("plant a member record with a gateway's role: %v", err)
	}
	ops, err := pgstore.Open(context.Background(), pgstore.Config{URL: c.URL("plant_ops", db)})
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	tok, _, err := ops.CreateToken("plant", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cc, err := control.NewClient(a.info.Control.String(), a.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	// The members list fills at the heartbeats (2 s): wait for all
	// four rows, then look at what a job is told.
	var ms []store.Member
	if !topology.Poll(10*time.Second, func() bool {
		ms, err = ops.Members()
		return err == nil && len(ms) == 4
	}) {
		t.Fatalf("members in the database: %+v %v, want 4", ms, err)
	}
	// One heartbeat more: A has read them. (Nothing of A's says when it
	// read the members; a join that names B could come from a read
	// before C's row was in, and prove nothing about C.)
	time.Sleep(2500 * time.Millisecond)
	l, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: control.JobInfo{BatchJobID: "plant-1", Hostname: "node1"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range l.Members {
		got[m.Gateway] = true
	}
	if len(l.Members) != 2 || !got[a.info.Control.String()] || !got[b.info.Control.String()] {
		t.Errorf("a job on A is told of members %+v; want A and B only (not the planted 203.0.113.66:8443, not C without the fleet key)", l.Members)
	}
}
