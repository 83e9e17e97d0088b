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
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// TestAddJobAllOrNothing checks the contract's AddJob in kernel mode: a job
// whose last part (an exposure nftables cannot express) fails leaves no
// SNAT, limit or DNAT rule, token or flow table entry; an address added
// twice and IPv6 addresses are refused without changing anything;
// RemoveJob removes every part.
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
		Addr:   addr,
		Block:  portblock.Range{Lo: 20000, Hi: 20255},
		Token:  "lab",
		Ref:    flows.JobRef{Lease: "L", JobID: "42", Token: "lab"},
		Limits: limits.Job{MaxFlows: 5, NewFlowsPerSec: 10},
		Exposures: []forward.Exposure{
			{Proto: ipproto.TCP, JobPort: 8080, PublicPort: 20255},
			{Proto: ipproto.Proto(132), JobPort: 9, PublicPort: 20254},
		},
	}
	nothingLeft := func(t *testing.T, what string) {
		t.Helper()
		if n := jobRuleCount(t, addr); n != 0 {
			t.Errorf("%s: %d snat rules left", what, n)
		}
		f.mu.Lock()
		_, job := f.jobs[addr]
		nLimits, nExposed := len(f.limitRules[addr]), len(f.exposed[addr])
		_, tok := f.tokens[addr]
		f.mu.Unlock()
		if job || nLimits != 0 || nExposed != 0 || tok {
			t.Errorf("%s: job %v, %d limit rules, %d dnat rules, token %v left", what, job, nLimits, nExposed, tok)
		}
		if js := tb.Jobs(); len(js) != 0 {
			t.Errorf("%s: the flow table still has %+v", what, js)
		}
		if err := f.SetJobLimits(addr, limits.Job{}); !errors.Is(err, forward.ErrUnknownJob) {
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
	}{
		{"ipv6 address", func(j *forward.Job) { j.Addr6 = netip.MustParseAddr("fd00::2") }},
		{"ipv6 egress", func(j *forward.Job) { j.Egress6 = netip.MustParseAddr("2001:db8::1") }},
	} {
		j := job
		j.Exposures = job.Exposures[:1]
		tc.mod(&j)
		if err := f.AddJob(j); !errors.Is(err, forward.ErrNotSupported) {
			t.Errorf("%s: AddJob got %v, want ErrNotSupported", tc.name, err)
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
	f.mu.Lock()
	nLimits, nExposed, tok := len(f.limitRules[addr]), len(f.exposed[addr]), f.tokens[addr]
	f.mu.Unlock()
	if n := jobRuleCount(t, addr); n != 3 || nLimits == 0 || nExposed == 0 || tok != "lab" {
		t.Errorf("after AddJob: %d snat rules, %d limit rules, %d dnat rules, token %q; want 3, some, some, lab", n, nLimits, nExposed, tok)
	}
	if js := tb.Jobs(); len(js) != 1 || js[0].JobRef != job.Ref {
		t.Errorf("flow table jobs: got %+v, want the job's ref", js)
	}
	if _, err := f.Stats(); err != nil {
		t.Errorf("Stats: %v", err)
	}
	f.RemoveJob(addr)
	nothingLeft(t, "RemoveJob")
}

// TestAddJobAllOrNothing6 checks AddJob's IPv6 side in kernel mode: with an
// IPv6 tunnel address configured a job's Addr6 is taken (its IPv6 NAT
// rules, its own address in set own6, its flow table alias); a job whose
// last part fails after its IPv6 side was added leaves none of it; an
// Addr6 outside the IPv6 tunnel subnet is refused before anything
// changes.
func TestAddJobAllOrNothing6(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	tb := flows.New(flows.Config{})
	f := newTestForwarder(t, func(c *Config) {
		c.Flows = tb
		c.Addr6 = netip.MustParsePrefix("fd00:a1::1/64")
		c.EgressPrefix6 = netip.MustParsePrefix("2001:db8:77::/64")
	})
	defer f.Close()
	addr, addr6 := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("fd00:a1::2")
	own := netip.MustParseAddr("2001:db8:77::2")
	job := forward.Job{
		Addr:    addr,
		Addr6:   addr6,
		Egress6: own,
		Block:   portblock.Range{Lo: 20000, Hi: 20255},
		Token:   "lab",
		Ref:     flows.JobRef{Lease: "L", JobID: "42", Token: "lab"},
		Limits:  limits.Job{MaxFlows: 5},
		Exposures: []forward.Exposure{
			{Proto: ipproto.UDP, JobPort: 5353, PublicPort: 5353, PublicAddr: own},
			{Proto: ipproto.Proto(132), JobPort: 9, PublicPort: 20254},
		},
	}
	state := func() (snat4, snat6, own6 int, has6 bool) {
		t.Helper()
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		els, err := c.GetSetElements(own6Set(table()))
		if err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		_, has6 = f.jobs6[addr]
		f.mu.Unlock()
		return jobRuleCount(t, addr), taggedCount(t, jobTag6(addr)), len(els), has6
	}
	if err := f.AddJob(job); err == nil {
		t.Fatal("AddJob succeeded with an sctp exposure")
	}
	if s4, s6, o, has6 := state(); s4 != 0 || s6 != 0 || o != 0 || has6 || len(tb.Jobs()) != 0 {
		t.Errorf("after a failed AddJob: %d snat rules, %d IPv6 snat rules, %d own6 elements, IPv6 side %v, flow table %+v left", s4, s6, o, has6, tb.Jobs())
	}
	bad := job
	bad.Addr6 = netip.MustParseAddr("fd00:b1::2")
	if err := f.AddJob(bad); err == nil {
		t.Error("AddJob accepted an IPv6 address outside the IPv6 tunnel subnet")
	}
	job.Exposures = job.Exposures[:1]
	if err := f.AddJob(job); err != nil {
		t.Fatalf("AddJob: %v", err)
	}
	if s4, s6, o, has6 := state(); s4 != 3 || s6 == 0 || o != 1 || !has6 {
		t.Errorf("after AddJob: %d snat rules, %d IPv6 snat rules, %d own6 elements, IPv6 side %v; want 3, some, 1, true", s4, s6, o, has6)
	}
	if js := tb.Jobs(); len(js) != 1 || js[0].JobRef != job.Ref {
		t.Errorf("flow table jobs: got %+v, want the job's ref", js)
	}
	f.RemoveJob(addr)
	if s4, s6, o, has6 := state(); s4 != 0 || s6 != 0 || o != 0 || has6 || len(tb.Jobs()) != 0 {
		t.Errorf("after RemoveJob: %d snat rules, %d IPv6 snat rules, %d own6 elements, IPv6 side %v, flow table %+v left", s4, s6, o, has6, tb.Jobs())
	}
}

// taggedCount returns the number of postrouting rules with user data tag.
func taggedCount(t *testing.T, tag []byte) int {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	post, _, _, _, _, _, _ := chains(table())
	rules, err := c.GetRules(table(), post)
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
