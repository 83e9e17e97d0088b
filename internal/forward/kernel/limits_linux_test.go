// SPDX-License-Identifier: MIT

package kernel

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func TestJobLimitRules(t *testing.T) {
	if got := testRules.jobLimitRules(limits.Job{EgressBitsPerSec: 1e6}); len(got) != 0 {
		t.Errorf("bandwidth only: got %d flow rules, want 0", len(got))
	}
	rules := testRules.jobLimitRules(limits.Job{MaxFlows: 7, NewFlowsPerSec: 2.4})
	if len(rules) != 2 {
		t.Fatalf("got %d rules, want 2", len(rules))
	}
	var cl *expr.Connlimit
	var lim *expr.Limit
	var gotos []string
	for _, r := range rules {
		for _, e := range r {
			switch e := e.(type) {
			case *expr.Connlimit:
				cl = e
			case *expr.Limit:
				lim = e
			case *expr.Verdict:
				gotos = append(gotos, e.Chain)
			}
		}
	}
	if cl == nil || cl.Count != 7 || cl.Flags != connlimitInvert {
		t.Errorf("connlimit: got %+v, want ct count over 7", cl)
	}
	if lim == nil || lim.Rate != 2 || lim.Burst != 3 || lim.Unit != expr.LimitTimeSecond || !lim.Over || lim.Type != expr.LimitTypePkts {
		t.Errorf("limit: got %+v, want limit rate over 2/second burst 3", lim)
	}
	if strings.Join(gotos, " ") != chainOverFlows+" "+chainOverRate {
		t.Errorf("verdicts: got %v", gotos)
	}
	for _, tt := range []struct {
		in    float64
		rate  uint64
		unit  expr.LimitTime
		burst uint32
	}{{1, 1, expr.LimitTimeSecond, 1}, {10.4, 10, expr.LimitTimeSecond, 11}, {0.5, 30, expr.LimitTimeMinute, 1}, {0.001, 1, expr.LimitTimeMinute, 1}} {
		if r, u, b := newFlowsLimit(tt.in); r != tt.rate || u != tt.unit || b != tt.burst {
			t.Errorf("newFlowsLimit(%v): got %d/%v burst %d, want %d/%v burst %d", tt.in, r, u, b, tt.rate, tt.unit, tt.burst)
		}
	}
	if got := ifbName("a-very-long-tun"); len(got) > 15 || !strings.HasSuffix(got, "-ifb") {
		t.Errorf("ifbName of a long name: %q", got)
	}
}

// htbClasses returns the HTB classes of a link by minor.
func htbClasses(t *testing.T, name string) map[uint16]*netlink.HtbClass {
	t.Helper()
	cs, err := netlink.ClassList(mustLink(t, name), 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint16]*netlink.HtbClass{}
	for _, c := range cs {
		if h, ok := c.(*netlink.HtbClass); ok {
			_, minor := netlink.MajorMinor(h.Handle)
			out[minor] = h
		}
	}
	return out
}

// u32Count returns the number of u32 filters under 1: on a link.
func u32Count(t *testing.T, name string) int {
	t.Helper()
	fs, err := netlink.FilterList(mustLink(t, name), netlink.MakeHandle(htbMajor, 0))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fs {
		if u, ok := f.(*netlink.U32); ok && u.ClassId != 0 {
			n++
		}
	}
	return n
}

// limitRuleCount returns how many rules the job's limit chain has (0 if
// it has none), after checking that job_limits jumps to it iff it exists.
func limitRuleCount(t *testing.T, addr netip.Addr) int {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	limits, _, _ := limitChains(table())
	rules, err := c.GetRules(table(), limits)
	if err != nil {
		t.Fatal(err)
	}
	jumps := 0
	for _, r := range rules {
		if bytes.Equal(r.UserData, limitTag(idOf(addr))) {
			jumps++
		}
	}
	own, err := c.GetRules(table(), jobLimitChain(table(), idOf(addr)))
	if err != nil {
		own = nil // no chain
	}
	if (jumps > 0) != (len(own) > 0) {
		t.Errorf("job %v: %d jumps to a limit chain with %d rules", addr, jumps, len(own))
	}
	return len(own)
}

// TestLimitsProgramming sets, changes and removes limits in a fresh
// network namespace and checks the tc classes and filters and nftables
// rules they become, and that a stale ifb is removed at start and the ifb
// at Close.
func TestLimitsProgramming(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	ifb := ifbName(DefaultName)
	// A killed gateway's leftover.
	if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: ifb}}); err != nil {
		t.Fatal(err)
	}
	f := newTestForwarder(t)
	defer f.Close()
	if _, err := netlink.LinkByName(ifb); err == nil {
		t.Fatalf("stale %s still there after New", ifb)
	}
	job := netip.MustParseAddr("100.64.0.9")
	if err := f.SetJobLimits(idOf(job), limits.Job{MaxFlows: 1}); !errors.Is(err, forward.ErrUnknownJob) {
		t.Errorf("SetJobLimits before AddJob: got %v, want ErrUnknownJob", err)
	}
	if err := f.AddJob(v4Job(job, portblock.Range{Lo: 20000, Hi: 20255})); err != nil {
		t.Fatal(err)
	}
	// Flow limits alone set up no shaping.
	if err := f.SetJobLimits(idOf(job), limits.Job{MaxFlows: 4, NewFlowsPerSec: 10}); err != nil {
		t.Fatal(err)
	}
	if got := limitRuleCount(t, job); got != 2 {
		t.Errorf("flow limit rules: got %d, want 2", got)
	}
	if _, err := netlink.LinkByName(ifb); err == nil {
		t.Errorf("%s exists without a bandwidth limit", ifb)
	}
	if err := f.SetJobLimits(idOf(job), limits.Job{EgressBitsPerSec: 100e6, IngressBitsPerSec: 50e6, MaxFlows: 4}); err != nil {
		t.Fatal(err)
	}
	if got := limitRuleCount(t, job); got != 1 {
		t.Errorf("flow limit rules after dropping the rate limit: got %d, want 1", got)
	}
	if out := nftList(t); out != "" && !strings.Contains(out, "ct count over 4") {
		t.Errorf("nft list table has no ct count over 4:\n%s", out)
	}
	for _, tt := range []struct {
		link string
		bps  uint64
	}{{ifb, 100e6}, {DefaultName, 50e6}} {
		cs := htbClasses(t, tt.link)
		c, ok := cs[firstJobMinor]
		if !ok || cs[rootMinor] == nil || cs[defaultMinor] == nil {
			t.Fatalf("%s classes: got %v, want root, default and the job's", tt.link, cs)
		}
		if c.Ceil != tt.bps/8 || c.Parent != netlink.MakeHandle(htbMajor, rootMinor) {
			t.Errorf("%s job class: ceil %d B/s parent %x, want %d B/s under 1:1", tt.link, c.Ceil, c.Parent, tt.bps/8)
		}
		if got := u32Count(t, tt.link); got != 1 {
			t.Errorf("%s: %d classifying filters, want 1", tt.link, got)
		}
	}
	// The TUN's ingress is redirected to the ifb.
	fs, err := netlink.FilterList(mustLink(t, DefaultName), netlink.MakeHandle(ingressHandle, 0))
	if err != nil || len(fs) != 1 {
		t.Errorf("ingress filters on %s: %v %v, want the redirect", DefaultName, fs, err)
	}
	// A global limit caps the root and the job's ceiling.
	if err := f.SetGlobalLimits(20e6, 0); err != nil {
		t.Fatal(err)
	}
	if cs := htbClasses(t, ifb); cs[rootMinor].Ceil != 20e6/8 || cs[firstJobMinor].Ceil != 20e6/8 {
		t.Errorf("ifb after a 20 Mbit/s global limit: root ceil %d, job ceil %d; want %d", cs[rootMinor].Ceil, cs[firstJobMinor].Ceil, uint64(20e6/8))
	}
	// Dropping the egress limit removes that class only.
	if err := f.SetJobLimits(idOf(job), limits.Job{IngressBitsPerSec: 50e6}); err != nil {
		t.Fatal(err)
	}
	if _, ok := htbClasses(t, ifb)[firstJobMinor]; ok || u32Count(t, ifb) != 0 {
		t.Errorf("ifb still has the job's class or filter after its egress limit was lifted")
	}
	if _, ok := htbClasses(t, DefaultName)[firstJobMinor]; !ok {
		t.Errorf("%s lost the job's ingress class", DefaultName)
	}
	st, err := f.limitStats()
	if err != nil || st != (limits.Stats{}) {
		t.Errorf("LimitStats without traffic: %+v %v", st, err)
	}
	f.RemoveJob(idOf(job))
	if _, ok := htbClasses(t, DefaultName)[firstJobMinor]; ok || u32Count(t, DefaultName) != 0 || limitRuleCount(t, job) != 0 {
		t.Errorf("after RemoveJob: classes %v, filters %d, rules %d; want none of the job's", htbClasses(t, DefaultName), u32Count(t, DefaultName), limitRuleCount(t, job))
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(ifb); err == nil {
		t.Errorf("%s still there after Close", ifb)
	}
}
