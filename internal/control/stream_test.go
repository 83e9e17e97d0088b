// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestTunnelUpgrade upgrades a control connection to the TCP transport
// and checks that bytes flow both ways on it, and that a bad lease is
// refused before any upgrade.
func TestTunnelUpgrade(t *testing.T) {
	b := &controltest.Backend{Attach: func(c net.Conn) {
		go func() { defer c.Close(); io.Copy(c, c) }() // echo
	}}
	gw := controltest.Start(t, b, controltest.Options{})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	conn, remote, err := c.DialTunnel(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret})
	if err != nil {
		t.Fatalf("DialTunnel: %v", err)
	}
	defer conn.Close()
	if remote.String() != gw.Addr {
		t.Errorf("remote %v, want %s", remote, gw.Addr)
	}
	msg := []byte("\x00\x20frames would go here, both ways")
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo: got %q, %v", got, err)
	}

	_, _, err = c.DialTunnel(ctx, control.LeaseRef{ID: lease.ID, Secret: "wrong"})
	if !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("tunnel with a wrong secret: got %v, want ErrUnknownLease", err)
	}
}

// TestWatch checks the lease watch: the first event names the instance,
// heartbeats follow, the watch ends when the lease ends, and an unknown
// lease is refused.
func TestWatch(t *testing.T) {
	b := &controltest.Backend{Instance: "abc123"}
	gw := controltest.Start(t, b, controltest.Options{WatchHeartbeat: 100 * time.Millisecond})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: lease.ID, Secret: lease.Secret}
	w, err := c.Watch(ctx, ref)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	if w.First.Instance != "abc123" || time.Duration(w.First.Heartbeat) != 100*time.Millisecond {
		t.Errorf("first event %+v, want instance abc123, heartbeat 100ms", w.First)
	}
	for i := 0; i < 3; i++ {
		if _, err := w.Next(); err != nil {
			t.Fatalf("heartbeat %d: %v", i, err)
		}
	}
	if err := c.Release(ctx, ref); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := w.Next(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end after the lease was released")
	}
	if _, err := c.Watch(ctx, ref); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("watch of a released lease: got %v, want ErrUnknownLease", err)
	}
}

// TestWatchEndsAtShutdown checks that stopping the server ends a watch at
// once (and that Shutdown does not wait for it).
func TestWatchEndsAtShutdown(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := gw.Server.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if _, err := w.Next(); err == nil {
		t.Fatal("watch still open after shutdown")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("watch ended %v after shutdown, want at once", d)
	}
}

// TestWatchLimit checks that one lease cannot hold more than a few
// watches open.
func TestWatchLimit(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: lease.ID, Secret: lease.Secret}
	var open []*control.Watch
	defer func() {
		for _, w := range open {
			w.Close()
		}
	}()
	for i := 0; i < 4; i++ {
		w, err := c.Watch(ctx, ref)
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		open = append(open, w)
	}
	if _, err := c.Watch(ctx, ref); !errors.Is(err, control.ErrRateLimited) {
		t.Fatalf("fifth watch: got %v, want ErrRateLimited", err)
	}
	open[0].Close()
	open = open[1:]
	if !topology.Poll(5*time.Second, func() bool {
		var w *control.Watch
		w, err = c.Watch(ctx, ref)
		if err == nil {
			open = append(open, w)
		}
		return err == nil
	}) {
		t.Fatalf("watch after closing one: %v", err)
	}
}

// TestWatchTellsEnded checks that a lease the gateway ends on purpose is
// announced over its watch at once, with the reason, long before the next
// heartbeat.
func TestWatchTellsEnded(t *testing.T) {
	b := &controltest.Backend{}
	gw := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Minute})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ended := make(chan error, 1)
	go func() {
		_, err := w.Next()
		ended <- err
	}()
	b.End(lease.ID, "kicked by admin: abuse report")
	t0 := time.Now()
	gw.Server.WakeWatches(lease.ID)
	select {
	case err := <-ended:
		if !errors.Is(err, control.ErrLeaseEnded) || !strings.Contains(err.Error(), "abuse report") {
			t.Errorf("watch ended with %v, want ErrLeaseEnded with the reason", err)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("watch told of the end after %v, want at once", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch not told within 5 s of the lease's end (heartbeat 1 min)")
	}
}
