// SPDX-License-Identifier: MIT

package kernel

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/nftables"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// TestAddJobAllOrNothing checks the contract's AddJob in kernel mode: a job
// whose last part (an exposure nftables cannot express) fails leaves no
// SNAT, limit or DNAT rule, token or flow table entry; an ID or address
// added twice and IPv6 addresses (without an IPv6 tunnel address) are
// refused without changing anything; RemoveJob removes every part.
func TestAddJobAllOrNothing(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	tb := flows.New(flows.Config{})
	f := newTestForwarderFlows(t, tb)
	defer f.Close()
	addr := netip.MustParseAddr("100.64.0.2")
	job := forward.Job{
		ID:     "L",
		Addrs:  []netip.Addr{addr},
		Egress: []forward.Egress{{Addr: netip.IPv4Unspecified(), Block: portblock.Range{Lo: 20000, Hi: 20255}}},
		Ref:    jobs.Ref{JobID: "42", Token: "lab"},
		Limits: limits.Job{MaxFlows: 5, NewFlowsPerSec: 10},
		Exposures: []forward.Exposure{
			{Proto: ipproto.TCP, JobPort: 8080, PublicPort: 20255, PublicAddr: egressAddr},
			{Proto: ipproto.Proto(132), JobPort: 9, PublicPort: 20254, PublicAddr: egressAddr},
		},
	}
	nothingLeft := func(t *testing.T, what string) {
		t.Helper()
		if n := jobRuleCount(t, "L"); n != 0 {
			t.Errorf("%s: %d snat rules left", what, n)
		}
		f.mu.Lock()
		kj := f.jobs["L"]
		f.mu.Unlock()
		if kj != nil {
			t.Errorf("%s: the job's state is left: %+v", what, kj)
		}
		if js := tb.Jobs(); len(js) != 0 {
			t.Errorf("%s: the flow table still has %+v", what, js)
		}
		if err := f.SetJobLimits("L", limits.Job{}); !errors.Is(err, forward.ErrUnknownJob) {
			t.Errorf("%s: SetJobLimits got %v, want ErrUnknownJob", what, err)
		}
	}
	if err := f.AddJob(job); err == nil {
		t.Fatal("AddJob succeeded with an sctp exposure")
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
		{"own address without the prefix", func(j *forward.Job) {
			j.Egress = []forward.Egress{{Addr: netip.MustParseAddr("198.51.100.9"), Own: true}}
		}, nil},
	} {
		j := job
		j.Exposures = job.Exposures[:1]
		tc.mod(&j)
		if err := f.AddJob(j); err == nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: AddJob got %v, want an error (%v)", tc.name, err, tc.want)
		}
		nothingLeft(t, tc.name)
	}

	job.Exposures = job.Exposures[:1]
	if err := f.AddJob(job); err != nil {
		t.Fatalf("AddJob: %v", err)
	}
	if err := f.AddJob(job); !errors.Is(err, forward.ErrJobExists) {
		t.Errorf("AddJob again: got %v, want ErrJobExists", err)
	}
	other := job
	other.ID, other.Exposures = "M", nil
	if err := f.AddJob(other); !errors.Is(err, forward.ErrJobExists) {
		t.Errorf("AddJob of another job at the address: got %v, want ErrJobExists", err)
	}
	f.mu.Lock()
	kj := *f.jobs["L"]
	f.mu.Unlock()
	if n := jobRuleCount(t, "L"); n != 3 || len(kj.limits) == 0 || len(kj.exposed) == 0 || kj.token != "lab" {
		t.Errorf("after AddJob: %d snat rules, %d limit rules, %d dnat rules, token %q; want 3, some, some, lab", n, len(kj.limits), len(kj.exposed), kj.token)
	}
	if js := tb.Jobs(); len(js) != 1 || js[0].Ref != job.Ref || js[0].Lease != "L" {
		t.Errorf("flow table jobs: got %+v, want the job's ref", js)
	}
	if _, err := f.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}
	f.RemoveJob("L")
	nothingLeft(t, "RemoveJob")
}

// TestAddJobAllOrNothingBothFamilies checks AddJob of a job with
// addresses of both families in kernel mode: with an IPv6 tunnel address
// configured its IPv6 address is taken (its NAT rule, its own address in
// set own6, its flow table entry); a job whose last part fails after its
// IPv6 side was added leaves none of it; an IPv6 address outside the IPv6
// tunnel subnet is refused before anything changes.
func TestAddJobAllOrNothingBothFamilies(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	tb := flows.New(flows.Config{})
	f := newTestForwarder(t, func(c *Config) {
		c.Flows = tb
		c.Addrs = append(c.Addrs, netip.MustParsePrefix("fd00:a1::1/64"))
		c.OwnPrefix = netip.MustParsePrefix("2001:db8:77::/64")
	})
	defer f.Close()
	addr, addr6 := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("fd00:a1::2")
	own := netip.MustParseAddr("2001:db8:77::2")
	job := forward.Job{
		ID:    "L",
		Addrs: []netip.Addr{addr, addr6},
		Egress: []forward.Egress{
			{Addr: netip.IPv4Unspecified(), Block: portblock.Range{Lo: 20000, Hi: 20255}},
			{Addr: own, Own: true},
		},
		Ref:    jobs.Ref{JobID: "42", Token: "lab"},
		Limits: limits.Job{MaxFlows: 5},
		Exposures: []forward.Exposure{
			{Proto: ipproto.UDP, JobPort: 5353, PublicPort: 5353, PublicAddr: own},
			{Proto: ipproto.Proto(132), JobPort: 9, PublicPort: 20254, PublicAddr: egressAddr},
		},
	}
	state := func() (snat, own6 int, kj *kjob) {
		t.Helper()
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		els, err := c.GetSetElements(ownSet(table()))
		if err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		kj = f.jobs["L"]
		f.mu.Unlock()
		return jobRuleCount(t, "L"), len(els), kj
	}
	if err := f.AddJob(job); err == nil {
		t.Fatal("AddJob succeeded with an sctp exposure")
	}
	if n, o, kj := state(); n != 0 || o != 0 || kj != nil || len(tb.Jobs()) != 0 {
		t.Errorf("after a failed AddJob: %d snat rules, %d own6 elements, state %+v, flow table %+v left", n, o, kj, tb.Jobs())
	}
	bad := job
	bad.Addrs = []netip.Addr{addr, netip.MustParseAddr("fd00:b1::2")}
	if err := f.AddJob(bad); err == nil {
		t.Error("AddJob accepted an IPv6 address outside the IPv6 tunnel subnet")
	}
	job.Exposures = job.Exposures[:1]
	if err := f.AddJob(job); err != nil {
		t.Fatalf("AddJob: %v", err)
	}
	if n, o, kj := state(); n != 4 || o != 1 || kj == nil || kj.own != addr6 || len(kj.exposed) != 1 {
		t.Errorf("after AddJob: %d snat rules, %d own6 elements, state %+v; want 4 (3 IPv4, 1 IPv6), 1, own %v, one dnat rule", n, o, kj, addr6)
	}
	if js := tb.Jobs(); len(js) != 1 || js[0].Ref != job.Ref {
		t.Errorf("flow table jobs: got %+v, want the job's ref", js)
	}
	f.RemoveJob("L")
	if n, o, kj := state(); n != 0 || o != 0 || kj != nil || len(tb.Jobs()) != 0 {
		t.Errorf("after RemoveJob: %d snat rules, %d own6 elements, state %+v, flow table %+v left", n, o, kj, tb.Jobs())
	}
}

// taggedCount returns the number of postrouting rules with user data tag.
func taggedCount(t *testing.T, tag []byte) int {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	t0 := table()
	rules, err := c.GetRules(t0, chainsOf(t0).post)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range rules {
		if bytes.Equal(r.UserData, tag) {
			n++
		}
	}
	return n
}

// jobRuleCount returns how many postrouting rules carry job id's tag.
func jobRuleCount(t *testing.T, id jobs.ID) int { return taggedCount(t, jobTag(id)) }
