// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// TestKeyNotSquatted checks that a stranger with a token and a job's
// public key cannot take the key once the job's lease has expired
// (issue 25, hole 9): the gateway remembers the keys of ended leases, and
// a join with one must prove the lease it held, as a join with a live
// lease's key must; the job itself, rejoining with that proof, gets in.
func TestKeyNotSquatted(t *testing.T) {
	g := openGateway(t)
	ctx := context.Background()
	tok := storedToken(t, g)
	remote := netip.MustParseAddrPort("127.0.0.1:1")
	priv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	victim := control.JoinRequest{PublicKey: priv.PublicKey(), Job: control.JobInfo{BatchJobID: "victim"}}
	l, err := g.Join(ctx, victim, tok, remote)
	if err != nil {
		t.Fatal(err)
	}
	// The victim's network fails for longer than the lease's lifetime.
	g.expire(time.Now().Add(g.leases.TTL() + time.Second))
	if n := g.leases.Len(); n != 0 {
		t.Fatalf("%d leases after expiry, want 0", n)
	}
	stranger := victim
	stranger.Job.BatchJobID = "stranger"
	if sl, err := g.Join(ctx, stranger, tok, remote); err == nil {
		t.Errorf("a stranger joined with the expired victim's key: lease %s", sl.ID)
	} else if !errors.Is(err, control.ErrKeyInUse) {
		t.Errorf("stranger's join with the victim's key: %v, want ErrKeyInUse", err)
	}
	// Another lease's proof does not do either.
	other, err := g.Join(ctx, joinRequest(t, g), tok, remote)
	if err != nil {
		t.Fatal(err)
	}
	stranger.Replace = &control.LeaseRef{ID: other.ID, Secret: other.Secret}
	if _, err := g.Join(ctx, stranger, tok, remote); !errors.Is(err, control.ErrKeyInUse) {
		t.Errorf("stranger's join proving another lease: %v, want ErrKeyInUse", err)
	}
	victim.Replace = &control.LeaseRef{ID: l.ID, Secret: l.Secret}
	if _, err := g.Join(ctx, victim, tok, remote); err != nil {
		t.Errorf("the victim's rejoin with proof of its expired lease: %v", err)
	}
}
