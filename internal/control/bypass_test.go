// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
)

// bypassBackend adds site-local bypass to the test backend.
type bypassBackend struct {
	*controltest.Backend

	mu      sync.Mutex
	cur     *control.Bypass
	changed chan struct{}
	reports [][]control.BypassCount
}

func (b *bypassBackend) LeaseBypass(ref control.LeaseRef) (*control.Bypass, <-chan struct{}, error) {
	if err := b.CheckLease(ref); err != nil {
		return nil, nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cur, b.changed, nil
}

func (b *bypassBackend) ReportBypass(ref control.LeaseRef, c []control.BypassCount) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reports = append(b.reports, c)
}

func (b *bypassBackend) set(x *control.Bypass) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cur = x
	close(b.changed)
	b.changed = make(chan struct{})
}

// TestWatchBypass checks that the first event carries the lease's
// bypass, that a change is sent at once (not at the next heartbeat, an
// hour away here) on a lease session and on a legacy watch, and that
// renewals carry the client's counters, checked by the server.
func TestWatchBypass(t *testing.T) {
	b := &bypassBackend{Backend: &controltest.Backend{Instance: "i"}, changed: make(chan struct{}),
		cur: &control.Bypass{Rules: []control.Rule{{Name: "squid", To: []netip.Prefix{netip.MustParsePrefix("10.0.0.5/32")}}}, Policy: control.Policy{Default: "allow"}}}
	gw2 := controltest.Start(t, b.Backend, controltest.Options{WatchHeartbeat: time.Hour, Serve: b})
	c := newClient(t, gw2)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw2.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: lease.ID, Secret: lease.Secret}
	w, err := c.Watch(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s, err := c.Attach(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Legacy() {
		t.Fatal("Attach fell back to a watch on a gateway with sessions")
	}
	for name, first := range map[string]control.WatchEvent{"watch": w.First, "session": s.First} {
		if first.Bypass == nil || len(first.Bypass.Rules) != 1 || first.Bypass.Rules[0].Name != "squid" {
			t.Fatalf("%s: first event %+v, want the bypass", name, first)
		}
	}
	b.set(&control.Bypass{Policy: control.Policy{Default: "deny"}})
	for name, next := range map[string]func() (control.WatchEvent, error){"watch": w.Next, "session": s.Next} {
		got := make(chan control.WatchEvent, 1)
		go func() {
			ev, _ := next()
			got <- ev
		}()
		select {
		case ev := <-got:
			if ev.Bypass == nil || len(ev.Bypass.Rules) != 0 || ev.Bypass.Policy.Default != "deny" {
				t.Errorf("%s: event after the change %+v, want the new (empty) bypass", name, ev)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no event within 5 s of a bypass change", name)
		}
	}

	counts := []control.BypassCount{{Rule: "squid", Flows: 2, BytesOut: 10, BytesIn: 1000}}
	if _, err := c.RenewReport(ctx, control.RenewRequest{LeaseRef: ref, Bypass: counts}); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	reports := b.reports
	b.mu.Unlock()
	if len(reports) != 1 || reports[0][0] != counts[0] {
		t.Errorf("reports %+v, want %+v", reports, counts)
	}
	dup := []control.BypassCount{{Rule: "a"}, {Rule: "a"}}
	if _, err := c.RenewReport(ctx, control.RenewRequest{LeaseRef: ref, Bypass: dup}); !errors.Is(err, control.ErrBadRequest) {
		t.Errorf("renewal with duplicate counters: %v, want ErrBadRequest", err)
	}
	if _, err := c.RenewReport(ctx, control.RenewRequest{LeaseRef: control.LeaseRef{ID: lease.ID, Secret: "x"}, Bypass: counts}); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("renewal with a wrong secret: %v, want ErrUnknownLease", err)
	}
	if len(b.reports) != 1 {
		t.Errorf("a refused renewal's counters were reported: %+v", b.reports)
	}
}
