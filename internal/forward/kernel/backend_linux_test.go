package kernel

import (
	"errors"
	"net/netip"
	"testing"

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
