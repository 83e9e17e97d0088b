// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// secGateway starts an in-process gateway whose leases live long enough
// for a test to look at them, with config (if not "") as its config
// file, and returns it with a control client.
func secGateway(t *testing.T, config string) (*testGateway, *control.Client) {
	t.Helper()
	g := startGatewayWith(t, func(c *Config) {
		c.RenewInterval, c.LeaseTTL = 10*time.Second, 30*time.Second
		if config != "" {
			c.ConfigFile = filepath.Join(t.TempDir(), "gateway.toml")
			if err := os.WriteFile(c.ConfigFile, []byte(config), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	})
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Close)
	return g, cc
}

func namedToken(t *testing.T, g *testGateway, name string) string {
	t.Helper()
	tok, _, err := admin.CreateToken(context.Background(), g.state, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func freshKey(t *testing.T) wgkey.Key {
	t.Helper()
	k, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey()
}

func adminClient(t *testing.T, g *testGateway) *admin.Client {
	t.Helper()
	ac, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ac.Close() })
	return ac
}

// TestJoinKeyInUse checks that a join for a public key that holds a live
// lease is refused unless it proves that lease (its id and secret), so
// that knowing a job's key does not evict it.
func TestJoinKeyInUse(t *testing.T) {
	g, cc := secGateway(t, "")
	tok := newToken(t, g)
	ctx := context.Background()
	key := freshKey(t)
	victim, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: key, Job: control.JobInfo{BatchJobID: "victim"}})
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: victim.ID, Secret: victim.Secret}
	for name, replace := range map[string]*control.LeaseRef{
		"no proof":     nil,
		"wrong secret": {ID: victim.ID, Secret: "guess"},
		"other lease":  {ID: "0123456789abcdef01234567", Secret: victim.Secret},
	} {
		_, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: key, Job: control.JobInfo{BatchJobID: "thief"}, Replace: replace})
		if !errors.Is(err, control.ErrKeyInUse) {
			t.Errorf("%s: join with the victim's key: got %v, want ErrKeyInUse", name, err)
		}
	}
	if _, err := cc.Renew(ctx, ref); err != nil {
		t.Fatalf("the victim's lease after the attempts: %v", err)
	}
	again, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: key, Job: control.JobInfo{BatchJobID: "victim"}, Replace: &ref})
	if err != nil {
		t.Fatalf("join with proof of the key's lease: %v", err)
	}
	if _, err := cc.Renew(ctx, ref); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("replaced lease: got %v, want ErrUnknownLease", err)
	}
	if _, err := cc.Renew(ctx, control.LeaseRef{ID: again.ID, Secret: again.Secret}); err != nil {
		t.Errorf("new lease: %v", err)
	}
}

// TestKickAmbiguous checks that a batch job id two leases claim is not
// kicked: the refusal lists both, and either can be kicked by lease id or
// tunnel address.
func TestKickAmbiguous(t *testing.T) {
	g, cc := secGateway(t, "")
	tok := newToken(t, g)
	ctx := context.Background()
	var leases []control.Lease
	for _, host := range []string{"cn1", "cn2"} {
		l, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: control.JobInfo{BatchJobID: "42", Hostname: host}})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	ac := adminClient(t, g)
	_, err := ac.Kick(ctx, admin.KickRequest{Job: "42"})
	if !errors.Is(err, admin.ErrAmbiguousJob) || !strings.Contains(err.Error(), leases[0].ID) || !strings.Contains(err.Error(), leases[1].ID) {
		t.Fatalf("kick of a batch id two leases claim: got %v, want ErrAmbiguousJob listing both", err)
	}
	for _, l := range leases {
		if _, err := cc.Renew(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret}); err != nil {
			t.Errorf("lease %s after the refused kick: %v", l.ID, err)
		}
	}
	if res, err := ac.Kick(ctx, admin.KickRequest{Job: leases[0].Addresses[0].Addr().String()}); err != nil || len(res.Kicked) != 1 || res.Kicked[0].Lease != leases[0].ID {
		t.Fatalf("kick by address: %+v, %v", res, err)
	}
	if res, err := ac.Kick(ctx, admin.KickRequest{Job: "42"}); err != nil || len(res.Kicked) != 1 || res.Kicked[0].Lease != leases[1].ID {
		t.Fatalf("kick of the batch id now one lease claims it: %+v, %v", res, err)
	}
}

// TestKickToldOverWatch checks that a kicked lease's watch says so at once
// (the heartbeat is 5 s, the renew interval 10 s), and that a ban refuses
// the job's token and host with the time left while another token joins.
func TestKickToldOverWatch(t *testing.T) {
	g, cc := secGateway(t, "")
	tok := newToken(t, g)
	other := namedToken(t, g, "other")
	ctx := context.Background()
	job := control.JobInfo{BatchJobID: "7", Hostname: "cn1"}
	l, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: job})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cc.Watch(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := w.Next(); err != nil {
				ended <- err
				return
			}
		}
	}()
	ac := adminClient(t, g)
	t0 := time.Now()
	res, err := ac.Kick(ctx, admin.KickRequest{Job: l.ID, Reason: "abuse report", Ban: "1h"})
	if err != nil || res.BannedUntil.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("kick --ban 1h: %+v, %v", res, err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, control.ErrLeaseEnded) || !strings.Contains(err.Error(), "abuse report") {
			t.Errorf("watch ended with %v, want ErrLeaseEnded with the reason", err)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("kick told over the watch after %v, want within 1 s", d)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("kick not told over the watch within 4 s")
	}
	_, err = cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: job})
	if !errors.Is(err, control.ErrBanned) || !strings.Contains(err.Error(), "1h0m0s from now") || !strings.Contains(err.Error(), "abuse report") {
		t.Errorf("join of the banned token and host: got %v, want ErrBanned with the time left and reason", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: other, PublicKey: freshKey(t), Job: job}); err != nil {
		t.Errorf("join of another token from the same host: %v", err)
	}
}

// TestRevokeEndsLeases checks that revoking a token ends its live leases,
// tells their watches at once, and leaves other tokens' jobs alone.
func TestRevokeEndsLeases(t *testing.T) {
	g, cc := secGateway(t, "")
	doomed := namedToken(t, g, "doomed")
	kept := namedToken(t, g, "kept")
	ctx := context.Background()
	l, err := cc.Join(ctx, control.JoinRequest{Token: doomed, PublicKey: freshKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	k, err := cc.Join(ctx, control.JoinRequest{Token: kept, PublicKey: freshKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cc.Watch(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	res, err := admin.RevokeToken(ctx, g.state, "doomed")
	if err != nil || len(res.Ended) != 1 || res.Ended[0].Lease != l.ID {
		t.Fatalf("revoke: %+v, %v, want lease %s ended", res, err, l.ID)
	}
	done := make(chan error, 1)
	go func() { _, err := w.Next(); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, control.ErrLeaseEnded) || !strings.Contains(err.Error(), "token doomed revoked") {
			t.Errorf("watch of the revoked token's lease: got %v, want ErrLeaseEnded naming the revocation", err)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("revocation not told over the watch within 4 s")
	}
	if _, err := cc.Renew(ctx, control.LeaseRef{ID: k.ID, Secret: k.Secret}); err != nil {
		t.Errorf("other token's lease after the revocation: %v", err)
	}
}

// TestTokenQuota checks max_leases and joins_per_minute: the refusal
// names the quota and what to do and says when to ask again (Retry-After),
// and another token's jobs still join; a join a little over its token's
// rate waits at the gateway instead of being refused.
func TestTokenQuota(t *testing.T) {
	g, cc := secGateway(t, `version = 1
[quota.token.small]
max_leases = 3
[quota.token.slow]
joins_per_minute = 2
[quota.token.shaped]
joins_per_minute = 30
`)
	small := namedToken(t, g, "small")
	slow := namedToken(t, g, "slow")
	big := namedToken(t, g, "big")
	ctx := context.Background()
	var first control.Lease
	for i := 0; i < 3; i++ {
		l, err := cc.Join(ctx, control.JoinRequest{Token: small, PublicKey: freshKey(t)})
		if err != nil {
			t.Fatalf("join %d of token small: %v", i+1, err)
		}
		if i == 0 {
			first = l
		}
	}
	_, err := cc.Join(ctx, control.JoinRequest{Token: small, PublicKey: freshKey(t)})
	if !errors.Is(err, control.ErrQuota) || !strings.Contains(err.Error(), "max_leases = 3") || !strings.Contains(err.Error(), "quota.token.small.max_leases") {
		t.Errorf("4th join of token small: got %v, want ErrQuota naming max_leases", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: big, PublicKey: freshKey(t)}); err != nil {
		t.Errorf("join of another token while small is at its quota: %v", err)
	}
	if err := cc.Release(ctx, control.LeaseRef{ID: first.ID, Secret: first.Secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: small, PublicKey: freshKey(t)}); err != nil {
		t.Errorf("join of token small after one of its jobs ended: %v", err)
	}
	for i := 0; i < 2; i++ {
		if _, err := cc.Join(ctx, control.JoinRequest{Token: slow, PublicKey: freshKey(t)}); err != nil {
			t.Fatalf("join %d of token slow: %v", i+1, err)
		}
	}
	_, err = cc.Join(ctx, control.JoinRequest{Token: slow, PublicKey: freshKey(t)})
	var ae *control.APIError
	if !errors.Is(err, control.ErrQuota) || !strings.Contains(err.Error(), "joins_per_minute = 2") || !errors.As(err, &ae) || ae.RetryAfter < 20*time.Second {
		t.Errorf("3rd join of token slow within a minute: got %v, want ErrQuota naming joins_per_minute with a Retry-After of about 30 s", err)
	}
	// 30 a minute in bursts of 30: the 31st join waits up to two
	// seconds at the gateway and gets its lease.
	shaped := namedToken(t, g, "shaped")
	var last time.Duration
	for i := 0; i < 31; i++ {
		t0 := time.Now()
		if _, err := cc.Join(ctx, control.JoinRequest{Token: shaped, PublicKey: freshKey(t)}); err != nil {
			t.Fatalf("join %d of token shaped: %v", i+1, err)
		}
		last = time.Since(t0)
	}
	if last < time.Second {
		t.Errorf("31st join of a 30-a-minute token took %v, want it to wait at the gateway (1-2 s)", last)
	}
}

// TestRevokedWhileDown checks that a token revoked while the gateway was
// stopped does not get its leases back at the next start.
func TestRevokedWhileDown(t *testing.T) {
	g := startGateway(t)
	tok := namedToken(t, g, "gone")
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ls, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t)})
	cc.Close()
	if err != nil {
		t.Fatal(err)
	}
	g.stop()
	if _, err := admin.RevokeToken(ctx, g.state, "gone"); err != nil {
		t.Fatal(err)
	}
	g2 := startGatewayAt(t, g.state)
	cc2, err := control.NewClient(g2.info.Control.String(), g2.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	if _, err := cc2.Renew(ctx, control.LeaseRef{ID: ls.ID, Secret: ls.Secret}); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("renew of a revoked token's lease after a restart: got %v, want ErrUnknownLease", err)
	}
}

// TestFromCheckedAtRenewal (issue 33, item 6): a token's source networks
// are checked at every request for a lease, not only at join: after
// `airlock token restrict` moves the token to other networks, a renewal,
// a lease watch and a release from the old network are refused.
func TestFromCheckedAtRenewal(t *testing.T) {
	g, cc := secGateway(t, "")
	tok := namedToken(t, g, "moved")
	ctx := context.Background()
	l, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: l.ID, Secret: l.Secret}
	if _, err := cc.Renew(ctx, ref); err != nil {
		t.Fatalf("renew before the restriction: %v", err)
	}
	if _, err := admin.RestrictToken(ctx, g.state, "moved", admin.TokenRestrictions{From: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Renew(ctx, ref); !errors.Is(err, control.ErrBadToken) {
		t.Errorf("renew from outside the token's networks: %v, want bad_token", err)
	}
	if _, err := cc.Watch(ctx, ref); err == nil {
		t.Errorf("lease watch from outside the token's networks: admitted")
	}
	if err := cc.Release(ctx, ref); !errors.Is(err, control.ErrBadToken) {
		t.Errorf("release from outside the token's networks: %v, want bad_token", err)
	}
}
