// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
)

// noTunnelBackend is a backend without the TCP transport.
type noTunnelBackend struct{ *controltest.Backend }

func (noTunnelBackend) Tunnel(context.Context, control.LeaseRef, netip.AddrPort) (func(net.Conn), error) {
	return nil, control.ErrNotSupported
}

// TestNotSupported checks the server's answers to a backend that offers
// neither the TCP transport nor site-local bypass: the tunnel upgrade is
// refused with a message that names the fix, and watches carry no bypass.
func TestNotSupported(t *testing.T) {
	b := &controltest.Backend{Instance: "i"}
	gw := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Hour, Serve: noTunnelBackend{b}})
	c := newClient(t, gw)
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatal(err)
	}
	ref := control.LeaseRef{ID: lease.ID, Secret: lease.Secret}
	_, _, err = c.DialTunnel(ctx, ref)
	var ae *control.APIError
	if !errors.As(err, &ae) || ae.Status != 404 || !strings.Contains(ae.Message, "use --transport udp") {
		t.Errorf("tunnel: got %v, want 404 naming --transport udp", err)
	}
	w, err := c.Watch(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.First.Bypass != nil {
		t.Errorf("first watch event %+v, want no bypass", w.First)
	}
	if _, err := c.RenewReport(ctx, control.RenewRequest{LeaseRef: ref, Bypass: []control.BypassCount{{Rule: "x", Flows: 1}}}); err != nil {
		t.Errorf("renewal with counters to a backend without bypass: %v", err)
	}
}
