// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// hostAddr returns a global unicast IPv4 address of this host, or the zero
// Addr if it has none.
func hostAddr() netip.Addr {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && p.Addr().IsGlobalUnicast() {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// openGateway opens a user-mode gateway on loopback with open (Run's first
// phase) and does not serve it: the test calls its methods. Jobs may
// expose 8080; where the host has a global unicast address, exposures
// listen on it.
func openGateway(t *testing.T) *gateway {
	t.Helper()
	cfg := Config{
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		StateDir:     filepath.Join(t.TempDir(), "state"),
		Listen:       "127.0.0.1:0",
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
		ExposePorts:  &policy.Exposure{Rules: []policy.ExposeRule{{Ports: []portblock.Range{{Lo: 8080, Hi: 8080}}}}},
		EgressAddrs:  []netip.Addr{hostAddr()},
	}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	g, err := open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(g.close)
	return g
}

// joinRequest is a join with a fresh key that exposes 8080/tcp if the
// gateway can expose ports.
func joinRequest(t *testing.T, g *gateway) control.JoinRequest {
	priv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	req := control.JoinRequest{PublicKey: priv.PublicKey(), Job: control.JobInfo{BatchJobID: "rollback"}}
	if g.egress.exposeAddr.IsValid() {
		req.Expose = []control.Port{{Proto: control.ProtoTCP, Port: 8080}}
	}
	return req
}

// checkNothingLeft fails t if anything of a job at addr remains: a lease,
// a port block, a live lease record, a job in the egress backend or the
// flow table, or a listener on the exposure's public port.
func checkNothingLeft(t *testing.T, g *gateway, addr netip.Addr, exposed netip.AddrPort, history bool) {
	t.Helper()
	if n := g.leases.Len(); n != 0 {
		t.Errorf("leases after a failed join: got %d, want 0", n)
	}
	if n := g.leases.BlocksUsed(); n != 0 {
		t.Errorf("port blocks in use after a failed join: got %d, want 0", n)
	}
	if history {
		if recs, err := g.st.ActiveLeases(); err != nil || len(recs) != 0 {
			t.Errorf("live lease records after a failed join: got %v, %v; want none", recs, err)
		}
	}
	if id, ok := g.index.Lookup(addr); ok {
		t.Errorf("job index after a failed join: %v is still job %s's", addr, id)
		if err := g.backend.SetJobLimits(id, limits.Job{MaxFlows: 1}); !errors.Is(err, forward.ErrUnknownJob) {
			t.Errorf("egress backend after a failed join: SetJobLimits got %v, want ErrUnknownJob (the job is gone)", err)
		}
	}
	if js := g.flows.Jobs(); len(js) != 0 {
		t.Errorf("flow table jobs after a failed join: got %+v, want none", js)
	}
	if exposed.IsValid() {
		ln, err := net.Listen("tcp", exposed.String())
		if err != nil {
			t.Errorf("exposure's public port %v still taken after a failed join: %v", exposed, err)
		} else {
			ln.Close()
		}
	}
}

// TestJoinRollback makes each step of a join after the lease fail for real
// (the egress backend's exposure, the lease history, the WireGuard peer)
// and checks that the one rollback path leaves nothing of the job.
func TestJoinRollback(t *testing.T) {
	var tok store.Token
	remote := netip.MustParseAddrPort("127.0.0.1:1")
	ctx := context.Background()

	t.Run("EgressBackend", func(t *testing.T) {
		g := openGateway(t)
		tok = storedToken(t, g)
		if !g.egress.exposeAddr.IsValid() {
			t.Skip("this host has no global unicast IPv4 address for user mode's exposures")
		}
		// The first lease gets the first address and block; its exposure
		// takes the block's top port, which the test holds.
		addr := g.gwAddr.Next()
		_, block := g.egress.pool.Run(0, 1)
		public := netip.AddrPortFrom(g.egress.exposeAddr, block.Hi)
		ln, err := net.Listen("tcp", public.String())
		if err != nil {
			t.Fatal(err)
		}
		_, err = g.Join(ctx, joinRequest(t, g), tok, remote)
		ln.Close()
		if err == nil {
			t.Fatal("join succeeded although the exposure's public port was taken")
		}
		checkNothingLeft(t, g, addr, netip.AddrPort{}, true)
		// Nothing stands in the way of the next join.
		l, err := g.Join(ctx, joinRequest(t, g), tok, remote)
		if err != nil {
			t.Fatalf("join after a failed one: %v", err)
		}
		if n := len(l.Exposed); n == 0 || n > 2 || l.Exposed[0].PublicAddr.Is6() || n == 2 && !l.Exposed[1].PublicAddr.Is6() {
			t.Errorf("exposed: got %v, want one port on IPv4 (and one on IPv6)", l.Exposed)
		}
	})

	t.Run("LeaseHistory", func(t *testing.T) {
		g := openGateway(t)
		// No token name, so that the closed store fails the history
		// step, not the token's check (an attested join has no token).
		tok = store.Token{}
		addr := g.gwAddr.Next()
		_, block := g.egress.pool.Run(0, 1)
		g.st.Close()
		if _, err := g.Join(ctx, joinRequest(t, g), tok, remote); err == nil {
			t.Fatal("join succeeded with the lease history closed")
		}
		checkNothingLeft(t, g, addr, exposedAt(g, block.Hi), false)
	})

	t.Run("WireGuardPeer", func(t *testing.T) {
		g := openGateway(t)
		tok = storedToken(t, g)
		addr := g.gwAddr.Next()
		_, block := g.egress.pool.Run(0, 1)
		// A WireGuard device of its own, closed: AddPeer fails, the egress
		// backend (which g.wg would close with it) stays open.
		wg, err := tunnel.NewGateway(g.log, tuntest.NewChannelTUN().TUN(), 1, conn.NewStdNetBind(), g.wgPriv, 0)
		if err != nil {
			t.Fatal(err)
		}
		wg.Close()
		open := g.wg
		g.wg = wg
		defer func() { g.wg = open }()
		if _, err := g.Join(ctx, joinRequest(t, g), tok, remote); err == nil {
			t.Fatal("join succeeded with the WireGuard device closed")
		}
		checkNothingLeft(t, g, addr, exposedAt(g, block.Hi), true)
		recs, err := g.local.Leases()
		if err != nil || len(recs) != 1 || recs[0].EndReason != "wireguard peer failed" {
			t.Errorf("lease history: got %+v, %v; want one record ended by the peer's failure", recs, err)
		}
	})
}

// storedToken makes a token in g's store and returns its record, as the
// control server passes it to Join once verified.
func storedToken(t *testing.T, g *gateway) store.Token {
	t.Helper()
	_, tok, err := g.st.CreateToken("t", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// exposedAt is the public address of an exposure on port, or the zero
// AddrPort if g cannot expose ports.
func exposedAt(g *gateway, port uint16) netip.AddrPort {
	if !g.egress.exposeAddr.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(g.egress.exposeAddr, port)
}
