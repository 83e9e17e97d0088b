// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
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
	time.Sleep(stale + 2*time.Second)
	if l, err := join(); err == nil || !strings.Contains(err.Error(), "fail-closed") {
		t.Errorf("attested join without a token on a fail-closed gateway whose copy is %v stale: lease %v, err %v; want refused as fail-closed", stale, l.ID, err)
	}
}
