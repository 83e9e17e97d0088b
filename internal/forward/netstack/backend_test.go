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
	"github.com/airlock-vpn/airlock/internal/jobs"
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
	p := newPair(t, Config{Egress: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Flows: tb})
	s := p.s

	first := freePort(t, "tcp")
	taken, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	lo := netip.MustParseAddr("127.0.0.1")
	job := forward.Job{
		ID:     "L",
		Addrs:  []netip.Addr{jobAddr},
		Egress: []forward.Egress{{Addr: netip.IPv4Unspecified(), Block: portblock.Range{Lo: 40000, Hi: 40255}}},
		Ref:    jobs.Ref{JobID: "42", Token: "lab"},
		Limits: limits.Job{MaxFlows: 5},
		Exposures: []forward.Exposure{
			{Proto: ipproto.TCP, JobPort: 8080, PublicPort: first, PublicAddr: lo},
			{Proto: ipproto.TCP, JobPort: 8081, PublicPort: uint16(taken.Addr().(*net.TCPAddr).Port), PublicAddr: lo},
		},
	}
	nothingLeft := func(t *testing.T, what string) {
		t.Helper()
		if s.jobs.get("L") != nil {
			t.Errorf("%s: the job's state (egress, token, limits) is still there", what)
		}
		if id, ok := s.reg.Index().Lookup(jobAddr); ok {
			t.Errorf("%s: the job index still names %s", what, id)
		}
		if js := tb.Jobs(); len(js) != 0 {
			t.Errorf("%s: the flow table still has %+v", what, js)
		}
		if err := s.SetJobLimits("L", limits.Job{}); !errors.Is(err, forward.ErrUnknownJob) {
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
		{"ipv6 address", func(j *forward.Job) { j.Addrs = append(j.Addrs, netip.MustParseAddr("fd00::2")) }, forward.ErrNotSupported},
		{"ipv6 egress", func(j *forward.Job) {
			j.Egress = append(j.Egress, forward.Egress{Addr: netip.MustParseAddr("2001:db8::1")})
		}, nil},
		{"two addresses of a family", func(j *forward.Job) { j.Addrs = append(j.Addrs, netip.MustParseAddr("100.64.0.3")) }, nil},
		{"no id", func(j *forward.Job) { j.ID = "" }, nil},
		{"bad limits", func(j *forward.Job) { j.Limits.MaxFlows = -1 }, nil},
		{"outside the subnet", func(j *forward.Job) { j.Addrs = []netip.Addr{netip.MustParseAddr("10.9.9.9")} }, nil},
		{"gateway's address", func(j *forward.Job) { j.Addrs = []netip.Addr{gwPrefix.Addr()} }, nil},
		{"bad exposure", func(j *forward.Job) {
			j.Exposures = []forward.Exposure{{Proto: ipproto.Proto(132), JobPort: 1, PublicPort: 1, PublicAddr: lo}}
		}, nil},
		{"exposure without an address", func(j *forward.Job) {
			j.Exposures = []forward.Exposure{{Proto: ipproto.TCP, JobPort: 1, PublicPort: 1}}
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
	again.Egress = []forward.Egress{{Addr: netip.IPv4Unspecified(), Block: portblock.Range{Lo: 50000, Hi: 50255}}}
	if err := s.AddJob(again); !errors.Is(err, forward.ErrJobExists) {
		t.Errorf("AddJob again: got %v, want ErrJobExists", err)
	}
	other := job
	other.ID, other.Exposures = "M", nil
	if err := s.AddJob(other); !errors.Is(err, forward.ErrJobExists) {
		t.Errorf("AddJob of another job at the same address: got %v, want ErrJobExists", err)
	}
	js := s.jobs.get("L")
	if js == nil || js.egress[0].block != job.Egress[0].Block || js.token != "lab" {
		t.Errorf("job after a refused second AddJob: %+v, want block %v and token lab", js, job.Egress[0].Block)
	}
	if js := tb.Jobs(); len(js) != 1 || js[0].Ref != job.Ref || js[0].Lease != "L" {
		t.Errorf("flow table jobs: got %+v, want the job's ref", js)
	}
	if l, err := net.Listen("tcp4", netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), first).String()); err == nil {
		l.Close()
		t.Error("the job's exposure does not listen")
	}
	if _, err := s.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}
	s.RemoveJob("L")
	nothingLeft(t, "RemoveJob")
	s.RemoveJob("L") // twice is harmless
}
