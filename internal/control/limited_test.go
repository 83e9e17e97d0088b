// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"golang.org/x/time/rate"
)

// TestLeaseRequestsNotLimited checks that a neighbour's bad joins from the
// job's own address never stop requests that prove a live lease: renew,
// watch, tunnel and release all succeed while the address is limited,
// while bad-token joins and requests with a wrong lease secret get 429.
func TestLeaseRequestsNotLimited(t *testing.T) {
	b := &controltest.Backend{Attach: func(c net.Conn) {
		go func() { defer c.Close(); io.Copy(c, c) }()
	}}
	gw := controltest.Start(t, b, controltest.Options{FailureLimit: rate.Every(time.Hour), FailureBurst: 2, WatchHeartbeat: 100 * time.Millisecond})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: lease.ID, Secret: lease.Secret}
	// The neighbour empties the address's failure bucket.
	for i := 0; i < 10; i++ {
		c.Join(ctx, joinReq("alk1_nope"))
	}
	if _, err := c.Join(ctx, joinReq("alk1_nope")); !errors.Is(err, control.ErrRateLimited) {
		t.Fatalf("bad join after the flood: got %v, want ErrRateLimited", err)
	}
	if _, err := c.Renew(ctx, control.LeaseRef{ID: lease.ID, Secret: "wrong"}); !errors.Is(err, control.ErrRateLimited) {
		t.Errorf("renew with a wrong secret while limited: got %v, want ErrRateLimited", err)
	}
	if _, err := c.Renew(ctx, ref); err != nil {
		t.Errorf("renew of a live lease while the address is limited: %v", err)
	}
	w, err := c.Watch(ctx, ref)
	if err != nil {
		t.Errorf("watch of a live lease while the address is limited: %v", err)
	} else {
		if _, err := w.Next(); err != nil {
			t.Errorf("watch heartbeat: %v", err)
		}
		w.Close()
	}
	conn, _, err := c.DialTunnel(ctx, ref)
	if err != nil {
		t.Errorf("tunnel of a live lease while the address is limited: %v", err)
	} else {
		conn.Close()
	}
	if err := c.Release(ctx, ref); err != nil {
		t.Errorf("release of a live lease while the address is limited: %v", err)
	}
	// The released lease is unknown now: a limited source gets 429.
	if _, err := c.Renew(ctx, ref); !errors.Is(err, control.ErrRateLimited) {
		t.Errorf("renew of a released lease while limited: got %v, want ErrRateLimited", err)
	}
}
