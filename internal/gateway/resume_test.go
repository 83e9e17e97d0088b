// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/proxy/proxytest"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// TestLeaseSurvivesRestart stops the gateway with a live lease and starts
// it again on the same state directory: the lease (id, secret, address,
// port block) is still valid, the instance id changed, and the history
// record is still open. After it is released the record is closed and
// keeps no resume state.
func TestLeaseSurvivesRestart(t *testing.T) {
	g := startGateway(t)
	tok := newToken(t, g)
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	priv, _ := wgkey.Generate()
	ctx := context.Background()
	ls, err := cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: priv.PublicKey(), Expose: []control.Port{{Proto: ipproto.TCP, Port: 8080}}})
	if err != nil {
		t.Fatal(err)
	}
	h1, err := cc.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cc.Close()
	g.stop()

	g2 := startGatewayAt(t, g.state)
	cc2, err := control.NewClient(g2.info.Control.String(), g2.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	ref := control.LeaseRef{ID: ls.ID, Secret: ls.Secret}
	if _, err := cc2.Renew(ctx, ref); err != nil {
		t.Fatalf("renew after restart: %v", err)
	}
	h2, err := cc2.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Jobs != 1 || h2.Instance == "" || h2.Instance == h1.Instance {
		t.Errorf("health after restart %+v (before %+v): want 1 job and a new instance", h2, h1)
	}
	w, err := cc2.Watch(ctx, ref)
	if err != nil {
		t.Fatalf("watch after restart: %v", err)
	}
	if w.First.Instance != h2.Instance {
		t.Errorf("watch instance %q, health %q", w.First.Instance, h2.Instance)
	}
	w.Close()
	// A second join gets another address: the restored one is taken.
	priv2, _ := wgkey.Generate()
	ls2, err := cc2.Join(ctx, control.JoinRequest{Token: tok, PublicKey: priv2.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	if ls2.Addresses[0].Addr() == ls.Addresses[0].Addr() || ls2.Ports == ls.Ports {
		t.Errorf("new join got the restored lease's address or block: %v %v", ls2.Addresses, ls2.Ports)
	}
	if err := cc2.Release(ctx, ref); err != nil {
		t.Fatalf("release restored lease: %v", err)
	}
	g2.stop()

	st, err := store.Open(filepath.Join(g.state, DBFile), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Leases()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		switch r.ID {
		case ls.ID:
			if r.End.IsZero() || r.EndReason != "released" || r.Resume != nil {
				t.Errorf("released restored lease: end %v %q, resume %+v", r.End, r.EndReason, r.Resume)
			}
			if len(r.Exposed) != 2 || !strings.HasPrefix(r.Exposed[0], "tcp/8080=") || !strings.HasPrefix(r.Exposed[1], "tcp/8080=[") {
				t.Errorf("exposed %v, want the one port, on the IPv4 and the IPv6 egress address", r.Exposed)
			}
		case ls2.ID:
			if !r.End.IsZero() || r.Resume == nil || r.Resume.Block < 0 {
				t.Errorf("live lease after stop: end %v, resume %+v; want open with resume state", r.End, r.Resume)
			}
		}
	}
}

// TestDrain drains the gateway through the admin socket: joins are
// refused with ErrDraining, health says so, running leases renew; undo
// takes joins again.
func TestDrain(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := startGatewayWith(t, func(c *Config) { c.Registry = reg })
	tok := newToken(t, g)
	j := joinJob(t, g, tok)
	ac, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ctx := context.Background()
	resp, err := ac.Drain(ctx, true)
	if err != nil || !resp.Draining || resp.Jobs != 1 {
		t.Fatalf("drain: %+v, %v", resp, err)
	}
	priv, _ := wgkey.Generate()
	_, err = j.cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: priv.PublicKey()})
	if !errors.Is(err, control.ErrDraining) {
		t.Errorf("join while draining: got %v, want ErrDraining", err)
	}
	if h, err := j.cc.Health(ctx); err != nil || !h.Draining {
		t.Errorf("health while draining: %+v, %v", h, err)
	}
	if v := gaugeValue(t, reg, "airlock_draining"); v != 1 {
		t.Errorf("airlock_draining = %v while draining, want 1", v)
	}
	if st, err := ac.Status(ctx); err != nil || !st.Draining || len(st.Jobs) != 1 || st.Jobs[0].Transport != "udp" {
		t.Errorf("status while draining: %+v, %v; want draining, one job on udp", st, err)
	}
	if _, err := j.cc.Renew(ctx, control.LeaseRef{ID: j.lease.ID, Secret: j.lease.Secret}); err != nil {
		t.Errorf("renew while draining: %v", err)
	}
	if resp, err := ac.Drain(ctx, false); err != nil || resp.Draining {
		t.Fatalf("undo drain: %+v, %v", resp, err)
	}
	if _, err := j.cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: priv.PublicKey()}); err != nil {
		t.Errorf("join after drain ended: %v", err)
	}
}

// TestInProcessTCPTransport carries a job's TCP connection over the TCP
// transport only (the client's UDP endpoint goes nowhere): stream upgrade
// on the control port, gateway bind, netstack, real listener.
func TestInProcessTCPTransport(t *testing.T) {
	echo := proxytest.TCPServer(t, proxytest.Echo)
	g := startGateway(t, remote{job: "198.51.100.7:80", real: echo.String()})
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	priv, _ := wgkey.Generate()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ls, err := cc.Join(ctx, control.JoinRequest{Token: newToken(t, g), PublicKey: priv.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	dev, tnet, err := netstack.CreateNetTUN([]netip.Addr{ls.Addresses[0].Addr()}, ls.DNS, ls.MTU)
	if err != nil {
		t.Fatal(err)
	}
	gwKey := ls.GatewayPublicKey
	log := slog.New(slog.DiscardHandler)
	bind := tunnel.NewBind(nil, log)
	wg, err := tunnel.NewClient(log, dev, bind, priv, gwKey, netip.MustParseAddrPort("127.0.0.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	defer wg.Close()
	c, remote, err := cc.DialTunnel(ctx, control.LeaseRef{ID: ls.ID, Secret: ls.Secret})
	if err != nil {
		t.Fatalf("dial tunnel: %v", err)
	}
	stream := bind.AddStream(c, remote, "test")
	bind.UseStream(stream)

	conn, err := tnet.DialContext(ctx, "tcp", "198.51.100.7:80")
	if err != nil {
		t.Fatalf("dial through the TCP transport: %v", err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("over TLS, inside WireGuard, inside TCP")
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo: %q, %v", got, err)
	}

	// Releasing the lease closes its stream.
	if err := cc.Release(ctx, control.LeaseRef{ID: ls.ID, Secret: ls.Secret}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stream.Done():
	case <-time.After(5 * time.Second):
		t.Error("stream still open after release")
	}
}

// gaugeValue reads the single value of series name from reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}
