// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
)

// TestOnJoin checks that every join request reports its outcome code
// ("" for success) and a duration to ServerConfig.OnJoin.
func TestOnJoin(t *testing.T) {
	var mu sync.Mutex
	var codes []string
	onJoin := func(code string, took time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if took <= 0 {
			t.Errorf("join took %v", took)
		}
		codes = append(codes, code)
	}
	b := &controltest.Backend{}
	gw := controltest.Start(t, b, controltest.Options{OnJoin: onJoin})
	c := newClient(t, gw)
	ctx := context.Background()
	if _, err := c.Join(ctx, joinReq(gw.Token(t))); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Join(ctx, joinReq("alk1_nope")); !errors.Is(err, control.ErrBadToken) {
		t.Fatalf("bad token: %v", err)
	}
	full := controltest.Start(t, &controltest.Backend{JoinErr: control.ErrNoAddress}, controltest.Options{OnJoin: onJoin})
	if _, err := newClient(t, full).Join(ctx, joinReq(full.Token(t))); !errors.Is(err, control.ErrNoAddress) {
		t.Fatalf("full gateway: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"", control.CodeBadToken, control.CodeNoAddress}; !slices.Equal(codes, want) {
		t.Errorf("OnJoin codes: got %q, want %q", codes, want)
	}
}

// TestLeaseEnded checks that a backend's ErrLeaseEnded reaches the client
// as ErrLeaseEnded with the backend's message.
func TestLeaseEnded(t *testing.T) {
	b := &controltest.Backend{RenewErr: fmt.Errorf("%w: ended by the gateway's admin: maintenance", control.ErrLeaseEnded)}
	gw := controltest.Start(t, b, controltest.Options{})
	c := newClient(t, gw)
	_, err := c.Renew(context.Background(), control.LeaseRef{ID: "a", Secret: "b"})
	if !errors.Is(err, control.ErrLeaseEnded) || errors.Is(err, control.ErrUnknownLease) || !strings.Contains(err.Error(), "maintenance") {
		t.Fatalf("renew of an ended lease: got %v, want ErrLeaseEnded with the reason", err)
	}
}
