// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/attest"
	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/test/pgtest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestFleetFailClosedAttested: --store-fail-closed refuses a join by MUNGE
// credential alone (no token) once the copy of the fleet's tokens and bans
// is stale, as it refuses a token join: such a join is judged by the same
// copy's bans. On today's main it is admitted (only VerifyToken asked).
func TestFleetFailClosedAttested(t *testing.T) {
	pgtest.Require(t)
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	url := c.URL(pgtest.Superuser, db)
	if _, _, err := pgstore.Migrate(context.Background(), pgstore.Config{URL: url}); err != nil {
		t.Fatal(err)
	}
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	me := uint32(os.Getuid())
	const stale = 2 * time.Second
	g := startGatewayWith(t, func(cfg *Config) {
		cfg.Store = StoreConfig{URL: url, FailClosed: true, Stale: stale}
		cfg.Attest = config.Attest{Mode: config.AttestMunge, Socket: d.Socket, JobUIDs: []uint32{me}}
	})
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	mc := munge.Client{Socket: d.Socket}
	join := func() (control.Lease, error) {
		key := freshKey(t)
		cred, err := attest.MakeJoin(ctx, mc, g.info.Fingerprint, key, "")
		if err != nil {
			t.Fatal(err)
		}
		return cc.Join(ctx, control.JoinRequest{PublicKey: key, Job: control.JobInfo{UID: int(me), Hostname: "node1"},
			Attest: &control.Attest{Munge: cred}})
	}
	l, err := join()
	if err != nil {
		t.Fatalf("attested join without a token, database up: %v", err)
	}
	cc.Release(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret})
	c.Stop(t)
	// Admitted until the copy is stale, then refused as fail-closed
	// (refusals count against the source's failure budget: few tries).
	if !topology.PollEvery(stale+5*time.Second, 250*time.Millisecond, func() bool {
		l, err = join()
		if err == nil {
			cc.Release(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret})
		}
		return err != nil
	}) || !strings.Contains(err.Error(), "fail-closed") {
		t.Errorf("attested join without a token on a fail-closed gateway whose copy is %v stale: lease %v, err %v; want refused as fail-closed", stale, l.ID, err)
	}
}

// TestFleetJobCredentialOnce: a job credential (root's, from the SPANK
// plugin) admits one job in the whole fleet: a copy of it presented to
// another member, whose munged (same key, replay cache of its own) has not
// seen it, is refused; the member that admitted it first takes a second
// join with it no more than munged allows. On today's main the second
// member admits the copy.
func TestFleetJobCredentialOnce(t *testing.T) {
	pgtest.Require(t)
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	url := c.URL(pgtest.Superuser, db)
	if _, _, err := pgstore.Migrate(context.Background(), pgstore.Config{URL: url}); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 1024)
	for i := range key {
		key[i] = byte(i * 7)
	}
	da := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1", Key: key})
	db2 := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1", Key: key})
	me := uint32(os.Getuid())
	fleetKey := testFleetKey(t)
	gw := func(socket, subnet string) *testGateway {
		return startGatewayWith(t, func(cfg *Config) {
			cfg.Store = StoreConfig{URL: url, FleetKey: fleetKey}
			cfg.Subnets = []netip.Prefix{netip.MustParsePrefix(subnet)}
			cfg.Attest = config.Attest{Mode: config.AttestMunge, Socket: socket, JobUIDs: []uint32{me}}
		})
	}
	a := gw(da.Socket, "100.64.0.0/16")
	b := gw(db2.Socket, "100.65.0.0/16")
	ctx := context.Background()
	mc := munge.Client{Socket: da.Socket}
	jc, err := attest.MakeJob(ctx, mc, attest.JobPayload{Batch: "slurm", JobID: "4343", Step: "0", UID: me, GID: uint32(os.Getgid()), Node: "cn1"}, 300)
	if err != nil {
		t.Fatal(err)
	}
	join := func(g *testGateway) (control.Lease, error) {
		cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		k := freshKey(t)
		cred, err := attest.MakeJoin(ctx, mc, g.info.Fingerprint, k, jc)
		if err != nil {
			t.Fatal(err)
		}
		return cc.Join(ctx, control.JoinRequest{PublicKey: k, Job: control.JobInfo{UID: int(me), Hostname: "cn1", BatchJobID: "4343", BatchSystem: "slurm"},
			Attest: &control.Attest{Munge: cred, MungeJob: jc}})
	}
	// The members' records (and so the claims' owners) are written at the
	// first heartbeat.
	pdb, err := pgstore.Open(ctx, pgstore.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	if !topology.Poll(10*time.Second, func() bool { ms, err := pdb.Members(); return err == nil && len(ms) == 2 }) {
		t.Fatal("the two gateways' member records not in the database within 10 s")
	}
	if _, err := join(a); err != nil {
		t.Fatalf("join on A with the job credential: %v", err)
	}
	l, err := join(b)
	if err == nil || !strings.Contains(err.Error(), "another gateway of the fleet") {
		t.Errorf("the same job credential on B: lease %q, err %v; want refused as used on another gateway of the fleet", l.ID, err)
	}
}
