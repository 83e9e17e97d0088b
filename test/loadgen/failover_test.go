// SPDX-License-Identifier: MIT

package loadgen

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/test/topology"
)

// testGateway is an in-process user-mode gateway on loopback.
type testGateway struct {
	state string
	info  gateway.Info
	stop  func()
}

func startGateway(t *testing.T, subnet string) *testGateway {
	t.Helper()
	g := &testGateway{state: filepath.Join(t.TempDir(), "state")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sg, err := gateway.Start(ctx, gateway.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: g.state, Listen: "127.0.0.1:0",
		Subnets: []netip.Prefix{netip.MustParsePrefix(subnet)}, RenewInterval: time.Second, LeaseTTL: 10 * time.Second,
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
	})
	if err != nil {
		t.Fatalf("gateway %s: %v", subnet, err)
	}
	g.info = sg.Info
	g.stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sg.Stop(ctx); errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("gateway %s did not stop within 10 s", subnet)
		}
	}
	t.Cleanup(g.stop)
	return g
}

// TestFailover runs two in-process gateways (user mode, loopback, no
// privileges) and 8 simulated jobs given both: they spread evenly by the
// client's least-loaded choice (started one by one), and when one gateway
// stops, each of its jobs moves to the other after the failover threshold
// (Failovers counts the moves, the spread shows every job on the
// survivor).
func TestFailover(t *testing.T) {
	a, b := startGateway(t, "100.64.0.0/24"), startGateway(t, "100.65.0.0/24")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tok, _, err := admin.CreateToken(ctx, a.state, "load", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ImportToken(ctx, b.state, "load", tok, 0); err != nil {
		t.Fatal(err)
	}
	addrA, addrB := a.info.Control.String(), b.info.Control.String()
	const n = 8
	g, err := New(Config{
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Gateway: addrA + "," + addrB, Pin: a.info.Fingerprint + "," + b.info.Fingerprint, Token: tok,
		N: n, Over: 2 * time.Second, Timeout: 5 * time.Second, FailoverAfter: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r := g.Start(ctx)
	if r.OK != n || r.Gateways[addrA] != n/2 || r.Gateways[addrB] != n/2 {
		t.Fatalf("start: ok %d of %d, spread %v, errors %v; want %d on each gateway", r.OK, n, r.Gateways, r.Errors, n/2)
	}
	a.stop()
	var s Report
	if !topology.Poll(20*time.Second, func() bool {
		s = g.Snapshot()
		return s.Gateways[addrB] == n && s.Failovers == n/2
	}) {
		t.Fatalf("20 s after gateway A stopped: spread %v, failovers %d, errors %v; want all %d jobs on B after %d failovers",
			s.Gateways, s.Failovers, s.Errors, n, n/2)
	}
}
