// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// fakeAttester attests uid 1000 for credentials "MUNGE:good:" and refuses
// the rest; it counts its calls.
type fakeAttester struct {
	required bool
	mu       sync.Mutex
	calls    int
}

func (f *fakeAttester) Required() bool { return f.required }

func (f *fakeAttester) Settle(control.JoinRequest, error) {}

func (f *fakeAttester) Verify(ctx context.Context, req control.JoinRequest, remote netip.AddrPort) (*identity.Attestation, error) {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	if n, ok := strings.CutPrefix(req.Attest.Munge, "MUNGE:uid-"); ok {
		uid, err := strconv.ParseUint(strings.TrimSuffix(n, ":"), 10, 32)
		if err == nil {
			return &identity.Attestation{By: "munge", UID: uint32(uid), Node: remote.Addr()}, nil
		}
	}
	if req.Attest.Munge != "MUNGE:good:" {
		return nil, fmt.Errorf("%w: the join's credential was used before", control.ErrAttestation)
	}
	return &identity.Attestation{By: "munge", UID: 1000, Node: remote.Addr()}, nil
}

func (f *fakeAttester) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func joinKey(t *testing.T) wgkey.Key {
	t.Helper()
	k, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey()
}

// TestAttestedJoins checks the control server's rules for credentials
// and tokens (issue 25, items 1 and 2): a valid credential joins without a
// token and reaches the backend as Attested (never from the wire); a bad
// one is refused with attestation_failed; a join without one is refused
// where the gateway or the token requires one; a token's source networks
// hold; a bad token is refused; and a
// gateway without an attester ignores credentials.
func TestAttestedJoins(t *testing.T) {
	ctx := context.Background()
	att := &fakeAttester{}
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{Attest: att, FailureLimit: 1000, FailureBurst: 1000})
	cc, err := control.NewClient(g.Addr, g.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	good := &control.Attest{Munge: "MUNGE:good:"}

	if _, err := cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Attest: good}); err != nil {
		t.Fatalf("join with a credential and no token: %v", err)
	}
	if js := b.Joins(); len(js) != 1 || js[0].Attested == nil || js[0].Attested.UID != 1000 || js[0].Token != "" {
		t.Errorf("backend got %+v, want the attestation and no token", js)
	}
	_, err = cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Attest: &control.Attest{Munge: "MUNGE:replayed:"}})
	if !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "used before") {
		t.Errorf("join with a refused credential: %v, want ErrAttestation with the reason", err)
	}
	// A bad token with a valid credential: refused (its failure counts
	// against the attested uid, TestLimitedSourceAttested).
	if _, err := cc.Join(ctx, control.JoinRequest{Token: store.TokenPrefix + "nope", PublicKey: joinKey(t), Attest: good}); !errors.Is(err, control.ErrBadToken) {
		t.Errorf("bad token with a credential: %v, want ErrBadToken", err)
	}
	// A token that requires attestation, and one with source networks.
	tok := g.Token(t)
	toks, _ := g.Store.Tokens()
	name := toks[0].Name
	if _, err := g.Store.RestrictToken(name, store.TokenRestrictions{Attest: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t)}); !errors.Is(err, control.ErrAttestationRequired) || !strings.Contains(err.Error(), "token "+name+" requires") {
		t.Errorf("join of an attest-only token without a credential: %v, want ErrAttestationRequired naming the token", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t), Attest: good}); err != nil {
		t.Errorf("join of an attest-only token with a credential: %v", err)
	}
	if _, err := g.Store.RestrictToken(name, store.TokenRestrictions{From: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t)}); !errors.Is(err, control.ErrBadToken) || !strings.Contains(err.Error(), "may not be used from 127.0.0.1") || strings.Contains(err.Error(), "10.0.0.0") {
		t.Errorf("join from outside the token's networks: %v, want ErrBadToken saying why without naming the networks (a leaked token's holder would learn where to use it)", err)
	}
	if _, err := g.Store.RestrictToken(name, store.TokenRestrictions{From: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t)}); err != nil {
		t.Errorf("join from inside the token's networks: %v", err)
	}

	// Site-wide: every join needs a credential.
	req := controltest.Start(t, &controltest.Backend{}, controltest.Options{Attest: &fakeAttester{required: true}})
	rc, err := control.NewClient(req.Addr, req.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := rc.Join(ctx, control.JoinRequest{Token: req.Token(t), PublicKey: joinKey(t)}); !errors.Is(err, control.ErrAttestationRequired) || !strings.Contains(err.Error(), "requires a MUNGE credential") {
		t.Errorf("join without a credential where one is required: %v, want ErrAttestationRequired", err)
	}

	// No attester: credentials are ignored; a token is needed.
	plainB := &controltest.Backend{}
	plain := controltest.Start(t, plainB, controltest.Options{})
	pc, err := control.NewClient(plain.Addr, plain.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, err := pc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Attest: good}); !errors.Is(err, control.ErrBadRequest) || !strings.Contains(err.Error(), "missing token") {
		t.Errorf("tokenless join at a gateway without attestation: %v, want a bad request saying a token is missing", err)
	}
	if _, err := pc.Join(ctx, control.JoinRequest{Token: plain.Token(t), PublicKey: joinKey(t), Attest: good}); err != nil {
		t.Errorf("join with a token and an ignored credential: %v", err)
	}
	if js := plainB.Joins(); len(js) != 1 || js[0].Attested != nil {
		t.Errorf("backend of a gateway without attestation got %+v, want no attestation", js)
	}
}

// TestLimitedSourceAttested (issue 33, item 3): a neighbour on a node who
// loops bad joins gets the node's address limited, but a join that carries
// a valid MUNGE credential from that address is judged on its own; the
// failures of attested joins count against their uid, not the address,
// so a user who loops bad joins with a credential is limited by uid and
// the node's other users are not.
func TestLimitedSourceAttested(t *testing.T) {
	ctx := context.Background()
	att := &fakeAttester{}
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{Attest: att, FailureLimit: 0.01, FailureBurst: 3})
	cc, err := control.NewClient(g.Addr, g.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	tok := g.Token(t)
	bad := store.TokenPrefix + "nope"
	// A user (uid 2000) loops bad tokens with a credential: limited by
	// uid, named in the answer; the address is not limited.
	for i := 0; i < 3; i++ {
		if _, err := cc.Join(ctx, control.JoinRequest{Token: bad, PublicKey: joinKey(t), Attest: &control.Attest{Munge: "MUNGE:uid-2000:"}}); !errors.Is(err, control.ErrBadToken) {
			t.Fatalf("bad token %d of uid 2000: %v", i, err)
		}
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t), Attest: &control.Attest{Munge: "MUNGE:uid-2000:"}}); !errors.Is(err, control.ErrRateLimited) || !strings.Contains(err.Error(), "uid 2000") {
		t.Errorf("uid 2000 after its failures: %v, want rate_limited naming the uid", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t)}); err != nil {
		t.Errorf("an unattested join from the same address after uid 2000's failures: %v, want admitted", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Attest: &control.Attest{Munge: "MUNGE:uid-1000:"}}); err != nil {
		t.Errorf("another user's attested join: %v, want admitted", err)
	}
	// A neighbour loops bad tokens without a credential: the address is
	// limited for unattested joins; another user's attested join from it
	// is judged on its own.
	for i := 0; i < 3; i++ {
		cc.Join(ctx, control.JoinRequest{Token: bad, PublicKey: joinKey(t)})
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t)}); !errors.Is(err, control.ErrRateLimited) {
		t.Errorf("an unattested join from the limited address: %v, want rate_limited", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Attest: &control.Attest{Munge: "MUNGE:uid-1001:"}}); err != nil {
		t.Errorf("an attested join from the limited address: %v, want admitted", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t), Attest: &control.Attest{Munge: "MUNGE:bad:"}}); !errors.Is(err, control.ErrRateLimited) {
		t.Errorf("a join with a bad credential from the limited address: %v, want rate_limited", err)
	}
}
