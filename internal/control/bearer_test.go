// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/internal/identity"
)

// fakeBearer verifies "h.good.s" (subject alice) and "h.bob.s" (subject
// bob), says the keys are unavailable for "h.later.s" and refuses the
// rest.
type fakeBearer struct{ required bool }

func (f fakeBearer) Required() bool { return f.required }

func (fakeBearer) Verify(ctx context.Context, tok string) (*identity.Issued, error) {
	switch tok {
	case "h.good.s":
		return &identity.Issued{Issuer: "https://iss", Subject: "alice", As: "cms"}, nil
	case "h.bob.s":
		return &identity.Issued{Issuer: "https://iss", Subject: "bob", As: "cms"}, nil
	case "h.later.s":
		return nil, fmt.Errorf("%w: keys of https://iss never fetched", control.ErrBearerUnavailable)
	}
	return nil, fmt.Errorf("%w: expired at noon", control.ErrBearer)
}

// TestBearerJoins: a join with a good bearer token needs no join token
// and reaches the backend with the issuer-verified identity (never from
// the wire), accounted under the issuer's name; with a join token too it
// is accounted under the token; a refused token is answered
// bearer_refused with the reason, an unverifiable one bearer_unavailable
// (which clears with time); a gateway without issuers refuses a token
// rather than ignore it; one that requires tokens refuses joins without;
// a renewal's token reaches Reidentify, over a session and over HTTP.
func TestBearerJoins(t *testing.T) {
	ctx := context.Background()
	b := &controltest.Backend{}
	g := controltest.Start(t, b, controltest.Options{Bearer: fakeBearer{}, FailureLimit: 1000, FailureBurst: 1000})
	cc, err := control.NewClient(g.Addr, g.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ls, err := cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Bearer: "h.good.s"})
	if err != nil {
		t.Fatalf("join with a bearer token alone: %v", err)
	}
	if js := b.Joins(); len(js) != 1 || js[0].Issued == nil || js[0].Issued.Subject != "alice" || js[0].Issued.As != "cms" {
		t.Fatalf("backend got %+v, want alice accounted as cms", js)
	}
	tok := g.Token(t)
	if _, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: joinKey(t), Bearer: "h.good.s"}); err != nil {
		t.Fatal(err)
	}
	if js := b.Joins(); len(js) != 2 || js[1].Issued == nil || js[1].Issued.As != "" {
		t.Fatalf("backend got %+v, want alice accounted under the join token", js[1])
	}
	_, err = cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Bearer: "h.bad.s"})
	if !errors.Is(err, control.ErrBearer) || !strings.Contains(err.Error(), "expired at noon") {
		t.Errorf("refused token: got %v, want ErrBearer with the reason", err)
	}
	_, err = cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Bearer: "h.later.s"})
	var ae *control.APIError
	if !errors.Is(err, control.ErrBearerUnavailable) || !errors.As(err, &ae) || ae.RetryAfter <= 0 {
		t.Errorf("unverifiable token: got %v, want ErrBearerUnavailable that clears with time", err)
	}
	if _, err = cc.Join(ctx, control.JoinRequest{PublicKey: joinKey(t), Bearer: "not a jwt"}); !errors.Is(err, control.ErrBadRequest) {
		t.Errorf("malformed token: got %v, want ErrBadRequest", err)
	}
	if len(b.Joins()) != 2 {
		t.Errorf("refused tokens reached the backend")
	}

	// Renewals carry the current token.
	s, err := cc.Attach(ctx, control.LeaseRef{ID: ls.ID, Secret: ls.Secret})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Renew(ctx, control.RenewRequest{Bearer: "h.bob.s"}); err != nil {
		t.Fatalf("session renewal with a token: %v", err)
	}
	if _, err := s.Renew(ctx, control.RenewRequest{Bearer: "h.bad.s"}); err != nil {
		t.Errorf("session renewal with a refused token: got %v, want the renewal (the lease keeps its identity)", err)
	}
	if _, err := cc.RenewReport(ctx, control.RenewRequest{LeaseRef: control.LeaseRef{ID: ls.ID, Secret: ls.Secret}, Bearer: "h.good.s"}); err != nil {
		t.Fatalf("renewal request with a token: %v", err)
	}
	if r := b.Reidentified(); len(r) != 2 || r[0].Subject != "bob" || r[1].Subject != "alice" {
		t.Errorf("reidentified %+v, want bob then alice", r)
	}

	// Without issuers: a token is refused, not ignored.
	g2 := controltest.Start(t, nil, controltest.Options{})
	cc2, _ := control.NewClient(g2.Addr, g2.Pin, 5*time.Second)
	defer cc2.Close()
	if _, err := cc2.Join(ctx, control.JoinRequest{Token: g2.Token(t), PublicKey: joinKey(t), Bearer: "h.good.s"}); !errors.Is(err, control.ErrBearer) || !strings.Contains(err.Error(), "takes no bearer tokens") {
		t.Errorf("token at a gateway without issuers: got %v, want ErrBearer", err)
	}
	// Required.
	g3 := controltest.Start(t, nil, controltest.Options{Bearer: fakeBearer{required: true}})
	cc3, _ := control.NewClient(g3.Addr, g3.Pin, 5*time.Second)
	defer cc3.Close()
	if _, err := cc3.Join(ctx, control.JoinRequest{Token: g3.Token(t), PublicKey: joinKey(t)}); !errors.Is(err, control.ErrBearerRequired) {
		t.Errorf("no token where required: got %v, want ErrBearerRequired", err)
	}
}
