// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
)

// TestRevokeRace checks the two ends of a token revocation that races a
// join (issue 25, hole 3): a join whose token was verified before `airlock
// token revoke` deleted it, but which allocates after the revoke listed
// the token's leases, gets no lease (the token is checked again under the
// admission lock); and a lease whose token is gone ends at its next
// renewal, whatever let it live.
func TestRevokeRace(t *testing.T) {
	g := openGateway(t)
	ctx := context.Background()
	remote := netip.MustParseAddrPort("127.0.0.1:1")
	now := time.Now()

	secret, _, err := g.st.CreateToken("racy", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	verified, err := g.st.VerifyToken(secret, now) // the control server's check
	if err != nil {
		t.Fatal(err)
	}
	// The revoke deletes the token and lists its leases: none yet.
	if err := g.st.RevokeToken("racy"); err != nil {
		t.Fatal(err)
	}
	if l, err := g.Join(ctx, joinRequest(t, g), verified, remote); err == nil {
		t.Errorf("a join verified before its token was revoked got lease %s after the revocation", l.ID)
	} else if !errors.Is(err, control.ErrBadToken) {
		t.Errorf("join of a revoked token: %v, want ErrBadToken", err)
	}
	if n := g.leases.Len(); n != 0 {
		t.Errorf("%d leases after the refused join, want 0", n)
	}

	secret, _, err = g.st.CreateToken("gone", 0, now)
	if err != nil {
		t.Fatal(err)
	}
	verified, err = g.st.VerifyToken(secret, now)
	if err != nil {
		t.Fatal(err)
	}
	l, err := g.Join(ctx, joinRequest(t, g), verified, remote)
	if err != nil {
		t.Fatal(err)
	}
	// Deleted from the store without the revoke's listing ending it.
	if err := g.st.RevokeToken("gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Renew(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret}); !errors.Is(err, control.ErrLeaseEnded) {
		t.Errorf("renewal of a lease whose token was revoked: %v, want ErrLeaseEnded", err)
	}
	if _, ok := g.leases.ByID(l.ID); ok {
		t.Errorf("lease %s of a revoked token still live after its renewal", l.ID)
	}
}
