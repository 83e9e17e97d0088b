// SPDX-License-Identifier: MIT

package netstack

import (
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// TestAddJobAllOrNothing checks the contract's AddJob on the Stack: a job
// whose last part (its second exposure) fails leaves nothing behind, not
// even its first exposure; an address added twice, an IPv6 address, bad
// limits and an address outside the subnet are refused without changing
// anything; RemoveJob removes every part.
func TestAddJobAllOrNothing(t *testing.T) {
	checkGoroutines(t)
	tb := flows.New(flows.Config{})
	p := newPair(t, Config{EgressAddr: netip.MustParseAddr("127.0.0.1"), Flows: tb})
	s := p.s

	first := freePort(t, "tcp")
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	job := forward.Job{
		Addr:   jobAddr,
		Block:  portblock.Range{Lo: 40000, Hi: 40255},
		Token:  "lab",
		Ref:    flows.JobRef{Lease: "L", JobID: "42", Token: "lab"},
		Limits: limits.Job{MaxFlows: 5},
		Exposures: []forward.Exposure{
			{Proto: ipproto.TCP, JobPort: 8080, PublicPort: first},
			{Proto: ipproto.TCP, JobPort: 8081, PublicPort: uint16(taken.Addr().(*net.TCPAddr).Port)},
		},
	}
	nothingLeft := func(t *testing.T, what string) {
		t.Helper()
		if _, ok := s.jobs.lookup(jobAddr); ok {
			t.Errorf("%s: the job's egress is still there", what)
		}
		if s.limits.job(jobAddr) != nil {
			t.Errorf("%s: the job's limits are still there", what)
		}
		if tok := s.pol.token(jobAddr); tok != "" {
			t.Errorf("%s: the job's token is still there: %q", what, tok)
		}
		if js := tb.Jobs(); len(js) != 0 {
			t.Errorf("%s: the flow table still has %+v", what, js)
		}
		if err := s.SetJobLimits(jobAddr, limits.Job{}); !errors.Is(err, forward.ErrUnknownJob) {
			t.Errorf("%s: SetJobLimits got %v, want ErrUnknownJob", what, err)
		}
		l, err := net.Listen("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), first).String())
		if err != nil {
			t.Errorf("%s: the first exposure's port is still taken: %v", what, err)
		} else {
			l.Close()
		}
	}

	if err := s.AddJob(job); err == nil {
		t.Fatal("AddJob succeeded although an exposure's port was taken")
	}
	nothingLeft(t, "failed exposure")

	for _, tc := range []struct {
		name string
		mod  func(*forward.Job)
		want error
	}{
		{"ipv6 address", func(j *forward.Job) { j.Addr6 = netip.MustParseAddr("fd00::2") }, forward.ErrNotSupported},
		{"ipv6 egress", func(j *forward.Job) { j.Egress6 = netip.MustParseAddr("2001:db8::1") }, forward.ErrNotSupported},
		{"bad limits", func(j *forward.Job) { j.Limits.MaxFlows = -1 }, nil},
		{"outside the subnet", func(j *forward.Job) { j.Addr = netip.MustParseAddr("10.9.9.9") }, nil},
		{"gateway's address", func(j *forward.Job) { j.Addr = gwPrefix.Addr() }, nil},
		{"bad exposure", func(j *forward.Job) {
			j.Exposures = []forward.Exposure{{Proto: ipproto.Proto(132), JobPort: 1, PublicPort: 1}}
		}, nil},
	} {
		j := job
		j.Exposures = job.Exposures[:1]
		tc.mod(&j)
		err := s.AddJob(j)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: AddJob got %v, want an error (%v)", tc.name, err, tc.want)
		}
		nothingLeft(t, tc.name)
	}

	job.Exposures = job.Exposures[:1]
	if err := s.AddJob(job); err != nil {
		t.Fatalf("AddJob: %v", err)
	}
	again := job
	again.Block = portblock.Range{Lo: 50000, Hi: 50255}
	if err := s.AddJob(again); !errors.Is(err, forward.ErrJobExists) {
		t.Errorf("AddJob again: got %v, want ErrJobExists", err)
	}
	if e, _ := s.jobs.lookup(jobAddr); e.block != job.Block {
		t.Errorf("block after a refused second AddJob: got %v, want %v", e.block, job.Block)
	}
	if tok := s.pol.token(jobAddr); tok != "lab" {
		t.Errorf("token: got %q, want lab", tok)
	}
	if js := tb.Jobs(); len(js) != 1 || js[0].JobRef != job.Ref {
		t.Errorf("flow table jobs: got %+v, want the job's ref", js)
	}
	if l, err := net.Listen("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), first).String()); err == nil {
		l.Close()
		t.Error("the job's exposure does not listen")
	}
	if _, err := s.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}
	s.RemoveJob(jobAddr)
	nothingLeft(t, "RemoveJob")
	s.RemoveJob(jobAddr) // twice is harmless
}
