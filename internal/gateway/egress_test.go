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

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

func TestPlanEgress(t *testing.T) {
	host := portblock.Range{Lo: 32768, Hi: 60999}
	src := netip.MustParseAddr("192.0.2.10")
	env := egressEnv{
		hostRange:     func() (portblock.Range, error) { return host, nil },
		defaultSource: func(*ipfamily.Family) (netip.Addr, error) { return src, nil },
	}
	noRoute := env
	noRoute.defaultSource = func(*ipfamily.Family) (netip.Addr, error) { return netip.Addr{}, errors.New("no default route") }
	pub := netip.MustParseAddr("203.0.113.1")
	for _, tt := range []struct {
		name     string
		cfg      Config
		env      egressEnv
		mode     string
		public   netip.Addr
		ports    portblock.Range
		blocks   int
		explicit bool
		wantErr  string // substring; "" means success
	}{
		{name: "user default", cfg: Config{}, env: env, mode: EgressUser, public: src, ports: host, blocks: host.Len() / 256},
		{name: "user no route", cfg: Config{}, env: noRoute, mode: EgressUser, public: netip.IPv4Unspecified(), ports: host, blocks: host.Len() / 256},
		{name: "user loopback", cfg: Config{EgressAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}, env: env, wantErr: "unicast"},
		{name: "user inside", cfg: Config{EgressPorts: portblock.Range{Lo: 40000, Hi: 40999}, BlockSize: 100}, env: env,
			mode: EgressUser, public: src, ports: portblock.Range{Lo: 40000, Hi: 40999}, blocks: 10},
		{name: "user with address", cfg: Config{Egress: EgressUser, EgressAddrs: []netip.Addr{pub}}, env: env, mode: EgressUser, public: pub, ports: host, blocks: host.Len() / 256},
		{name: "user wider than host", cfg: Config{EgressPorts: portblock.Range{Lo: 20000, Hi: 59999}}, env: env,
			mode: EgressUser, public: src, ports: portblock.Range{Lo: 20000, Hi: 59999}, blocks: 156, explicit: true},
		{name: "user pool", cfg: Config{EgressAddrs: []netip.Addr{pub, pub.Next()}, BlockSize: 1000}, env: env,
			mode: EgressUser, public: pub, ports: host, blocks: 2 * (host.Len() / 1000)},
		{name: "kernel pool", cfg: Config{Egress: EgressKernel, EgressAddrs: []netip.Addr{pub, pub.Next(), pub.Next().Next()}}, env: env,
			mode: EgressKernel, public: pub, ports: DefaultKernelPorts, blocks: 3 * 156},
		{name: "pool with loopback", cfg: Config{EgressAddrs: []netip.Addr{pub, netip.MustParseAddr("127.0.0.2")}}, env: env, wantErr: "unicast"},
		{name: "user IPv6-only one IPv6", cfg: Config{Subnets: []netip.Prefix{netip.MustParsePrefix("fd7a::/112")}, EgressAddrs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}}, env: env,
			mode: EgressUser, public: netip.MustParseAddr("2001:db8::1"), ports: host, blocks: host.Len() / 256},
		{name: "user IPv4 and IPv6", cfg: Config{EgressAddrs: []netip.Addr{netip.MustParseAddr("2001:db8::1"), pub}}, env: env,
			mode: EgressUser, public: pub, ports: host, blocks: host.Len() / 256},
		{name: "pool with two IPv6", cfg: Config{EgressAddrs: []netip.Addr{pub, netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")}}, env: env, wantErr: "at most one"},
		{name: "IPv6-only pool", cfg: Config{Subnets: []netip.Prefix{netip.MustParsePrefix("fd7a::/112")}, EgressAddrs: []netip.Addr{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")}}, env: env, wantErr: "IPv4"},
		{name: "user block too big", cfg: Config{EgressPorts: portblock.Range{Lo: 40000, Hi: 40099}, BlockSize: 101}, env: env, wantErr: "--block-size"},
		{name: "kernel default", cfg: Config{Egress: EgressKernel, EgressAddrs: []netip.Addr{pub}}, env: env,
			mode: EgressKernel, public: pub, ports: DefaultKernelPorts, blocks: 156},
		{name: "kernel wide", cfg: Config{Egress: EgressKernel, EgressAddrs: []netip.Addr{pub}, EgressPorts: portblock.Range{Lo: 1024, Hi: 65535}, BlockSize: 1024}, env: env,
			mode: EgressKernel, public: pub, ports: portblock.Range{Lo: 1024, Hi: 65535}, blocks: 63},
		{name: "kernel default route", cfg: Config{Egress: EgressKernel}, env: env, mode: EgressKernel, public: src, ports: DefaultKernelPorts, blocks: 156},
		{name: "kernel no route", cfg: Config{Egress: EgressKernel}, env: noRoute, wantErr: "set --egress-addr"},
		{name: "kernel v6", cfg: Config{Egress: EgressKernel, Subnets: []netip.Prefix{netip.MustParsePrefix("fd7a::/112")}, EgressAddrs: []netip.Addr{netip.MustParseAddr("2001:db8::1")}}, env: env, wantErr: "IPv4"},
		{name: "kernel unspecified", cfg: Config{Egress: EgressKernel, EgressAddrs: []netip.Addr{netip.IPv4Unspecified()}}, env: env, wantErr: "unicast"},
		{name: "bad mode", cfg: Config{Egress: "fast"}, env: env, wantErr: `--egress "fast"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := planEgress(tt.cfg, tt.env)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.mode != tt.mode || got.public != tt.public || got.plan.Range != tt.ports || got.pool.Blocks() != tt.blocks || got.explicit != tt.explicit {
				t.Errorf("got mode %s public %v ports %v blocks %d explicit %v, want %s %v %v %d %v",
					got.mode, got.public, got.plan.Range, got.pool.Blocks(), got.explicit, tt.mode, tt.public, tt.ports, tt.blocks, tt.explicit)
			}
		})
	}
}

// TestPortBlocks runs a user-mode gateway with two port blocks: two jobs
// get distinct blocks, recorded in the history and answered by whois; a
// third join is refused with an explanation until one leaves.
func TestPortBlocks(t *testing.T) {
	host, err := portblock.HostEphemeralRange()
	if err != nil {
		t.Fatal(err)
	}
	ports := portblock.Range{Lo: host.Lo, Hi: host.Lo + 511}
	state := filepath.Join(t.TempDir(), "state")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Info, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
			StateDir:      state,
			Listen:        "127.0.0.1:0",
			RenewInterval: time.Minute,
			DNSUpstreams:  []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
			EgressPorts:   ports,
			BlockSize:     256,
			Ready:         func(i Info) { ready <- i },
		})
	}()
	var info Info
	select {
	case info = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("gateway exited before ready: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("gateway not ready within 10s")
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway run: %v", err)
		}
	}
	defer stop()

	g := &testGateway{info: info, state: state}
	tok := newToken(t, g)
	cc, err := control.NewClient(info.Control.String(), info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	join := func(job string) (control.Lease, error) {
		priv, _ := wgkey.Generate()
		return cc.Join(context.Background(), control.JoinRequest{Token: tok, PublicKey: priv.PublicKey(), Job: control.JobInfo{BatchJobID: job}})
	}
	wantPub, err := defaultRouteSource(ipfamily.V4)
	if err != nil {
		wantPub = netip.IPv4Unspecified()
	}
	var leases []control.Lease
	for _, job := range []string{"job-1", "job-2"} {
		ls, err := join(job)
		if err != nil {
			t.Fatalf("join %s: %v", job, err)
		}
		if len(ls.PublicAddrs) == 0 || ls.PublicAddrs[0] != wantPub {
			t.Errorf("%s: public addrs %v, want %v first (the default route's source)", job, ls.PublicAddrs, wantPub)
		}
		if ls.Ports[1]-ls.Ports[0] != 255 || ls.Ports[0] < ports.Lo || ls.Ports[1] > ports.Hi {
			t.Errorf("%s: ports %v, want a 256-port block of %v", job, ls.Ports, ports)
		}
		leases = append(leases, ls)
	}
	if leases[0].Ports == leases[1].Ports {
		t.Errorf("both jobs got block %v", leases[0].Ports)
	}
	_, err = join("job-3")
	var ae *control.APIError
	if !errors.As(err, &ae) || ae.Status != 503 || !errors.Is(err, control.ErrNoAddress) ||
		!strings.Contains(err.Error(), "all 2 port blocks of "+ports.String()+" are in use; widen --egress-ports or lower --block-size") {
		t.Errorf("third join: got %v, want 503 naming the exhausted port blocks", err)
	}
	if err := cc.Release(context.Background(), control.LeaseRef{ID: leases[0].ID, Secret: leases[0].Secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := join("job-3"); err != nil {
		t.Errorf("join after a release: %v", err)
	}
	during := time.Now()
	stop()

	st, err := store.Open(filepath.Join(state, DBFile), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Whois(wantPub, leases[1].Ports[0]+7, during)
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := firstAttribution(recs); len(recs) == 0 || recs[0].JobID != "job-2" || a.PortLo != leases[1].Ports[0] || a.PortHi != leases[1].Ports[1] {
		t.Errorf("whois in job-2's block: got %+v, want job-2 with its block", recs)
	}
}

// firstAttribution returns the first attribution of the first of recs.
func firstAttribution(recs []store.LeaseRecord) (store.Attribution, bool) {
	if len(recs) == 0 || len(recs[0].Egress) == 0 {
		return store.Attribution{}, false
	}
	return recs[0].Egress[0], true
}
