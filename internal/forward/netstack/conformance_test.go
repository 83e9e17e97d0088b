package netstack

import (
	"context"
	"errors"
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
			forwardtest.Run(t, forwardtest.Options{New: func(t *testing.T, env forwardtest.Env) forwardtest.Backend {
				return newConformanceStack(t, name, env)
			}})
		})
	}
}

func newConformanceStack(t *testing.T, tcpStack string, env forwardtest.Env) forwardtest.Backend {
	// Host ping sockets for the isolated namespace's root (the test's
	// own gid).
	if err := forwardtest.WriteSysctl("net/ipv4/ping_group_range", "0 0"); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Logger:         env.Logger,
		Addr:           env.Tunnel,
		MTU:            env.MTU,
		DNSUpstreams:   []netip.AddrPort{env.DNS},
		UDPIdleTimeout: env.UDPIdle,
		Flows:          env.Flows,
		EgressAddr:     env.Egress,
	}
	if tcpStack == "kernel" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ns, err := usernet.Open(ctx, env.Tunnel.Masked(), env.MTU)
		if err != nil {
			t.Fatalf("open private namespace for kernel tcp: %v", err)
		}
		cfg.KernelTCP = ns
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return conformanceStack{s}
}

// conformanceStack adapts the Stack's methods to the suite's contract.
type conformanceStack struct{ *Stack }

func (s conformanceStack) AddJob(j forwardtest.Job) (err error) {
	if err := s.Stack.AddJob(j.Addr, j.Egress, j.Block); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.RemoveJob(j.Addr)
		}
	}()
	if err := s.SetJobToken(j.Addr, j.Token); err != nil {
		return err
	}
	if err := s.Stack.SetJobLimits(j.Addr, j.Limits); err != nil {
		return err
	}
	if len(j.Exposures) > 0 {
		return s.Expose(j.Addr, j.Exposures)
	}
	return nil
}

func (s conformanceStack) RemoveJob(addr netip.Addr) {
	s.Unexpose(addr)
	s.Stack.RemoveJob(addr)
}

func (s conformanceStack) SetJobLimits(addr netip.Addr, l forward.Limits) error {
	if _, ok := s.jobs.lookup(addr.Unmap()); !ok {
		return forward.ErrUnknownJob
	}
	return s.Stack.SetJobLimits(addr, l)
}

func (s conformanceStack) Stats() (forwardtest.Stats, error) {
	ls, err := s.LimitStats()
	drops, derr := s.PolicyDrops()
	return forwardtest.Stats{Limits: ls, PolicyDrops: drops, BlockRefusals: s.Stack.Stats().BlockExhausted}, errors.Join(err, derr)
}
