// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/forward/forwardtest"
	"github.com/airlock-vpn/airlock/internal/usernet"
)

// TestConformance runs the egress backends' conformance suite against the
// user-mode backend, with jobs' TCP terminated by gVisor and by the kernel
// of a private namespace.
func TestConformance(t *testing.T) {
	for _, name := range tcpStacks {
		t.Run(name, func(t *testing.T) {
			if !forwardtest.Isolate(t) {
				return
			}
			forwardtest.Run(t, forwardtest.Options{New: func(t *testing.T, env forwardtest.Env) forward.Backend {
				return newConformanceStack(t, name, env)
			}})
		})
	}
}

func newConformanceStack(t *testing.T, tcpStack string, env forwardtest.Env) forward.Backend {
	// Host ping sockets for the isolated namespace's root (the test's
	// own gid).
	if err := forwardtest.WriteSysctl("net/ipv4/ping_group_range", "0 0"); err != nil {
		t.Fatal(err)
	}
	// Jobs' own addresses: a local route, as the gateway's user-mode
	// setup for --egress-prefix makes.
	if err := forwardtest.LocalRoute(env.OwnPrefix); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Logger:         env.Logger,
		Addrs:          env.Tunnels,
		MTU:            env.MTU,
		DNSUpstreams:   []netip.AddrPort{env.DNS},
		UDPIdleTimeout: env.UDPIdle,
		Flows:          env.Flows,
		Egress:         env.Egress,
	}
	if tcpStack == "kernel" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var subnets []netip.Prefix
		for _, p := range env.Tunnels {
			subnets = append(subnets, p.Masked())
		}
		// A multi-queue TUN read by 3 goroutines (internal/mqtun).
		ns, err := usernet.Open(ctx, subnets, env.MTU, 3)
		if err != nil {
			t.Fatalf("open private namespace for kernel tcp: %v", err)
		}
		cfg.KernelTCP = ns
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}
