// SPDX-License-Identifier: MIT

package kernel

// Limits in kernel mode. Theory of operation:
//
// Flow limits are nftables rules in a chain per job with limits,
// limits_ID, which the chain job_limits (from_jobs jumps to it for every
// packet from a job) jumps to for each of the job's addresses (`ip saddr
// JOB jump limits_ID`, `ip6 saddr JOB6 jump limits_ID`): `ct state new ct
// count over N goto over_flows` and `ct state new limit rate over
// R/second burst ⌈R⌉ packets goto over_rate`. One chain for all its
// addresses makes one count and one rate for the job's flows of both
// families together. Both over_ chains count and then refuse like
// any refused flow (TCP reset, ICMP port unreachable for UDP), so the job
// fails at once.
//
// Bandwidth is shaped by HTB qdiscs (tc_linux.go), set up the first time a
// bandwidth limit is set: traffic to jobs on the TUN's own egress,
// classified by destination address; traffic from jobs, which enters the
// host on the TUN's ingress where no qdisc can queue, is redirected to an
// ifb device and shaped on its egress, classified by source address. Each
// direction has a root class at the global rate, a default class for jobs
// without a limit, and one class per limited job whose ceiling is its rate.
// A queue that fills drops, and TCP backs off; HTB holds TCP to its
// ceiling within a few per cent.

import (
	"fmt"
	"math"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
)

// Names of the limit chains and tags.
const (
	chainLimits    = "job_limits"
	chainOverFlows = "over_flows"
	chainOverRate  = "over_rate"
	limitTagPrefix = "airlock limit "
)

// limitChains returns the chains of the flow limits.
func limitChains(t *nftables.Table) (limits, overFlows, overRate *nftables.Chain) {
	return &nftables.Chain{Name: chainLimits, Table: t},
		&nftables.Chain{Name: chainOverFlows, Table: t},
		&nftables.Chain{Name: chainOverRate, Table: t}
}

// overRules count a refused flow and refuse it.
func overRules() [][]expr.Any {
	return [][]expr.Any{{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainRefuse}}}
}

// limitTag marks the flow limit jumps of job id.
func limitTag(id jobs.ID) []byte { return []byte(limitTagPrefix + string(id)) }

// newFlowsLimit converts a new-flow rate to nftables' integer limit: per
// second for rates of 1 and more (rounded), else per minute. The burst
// is ⌈rate⌉ flows as in user mode (nftables lets exactly burst packets
// through at once; without one it would allow 5).
func newFlowsLimit(perSec float64) (rate uint64, unit expr.LimitTime, burst uint32) {
	if perSec >= 1 {
		return uint64(math.Round(perSec)), expr.LimitTimeSecond, uint32(math.Ceil(perSec))
	}
	return uint64(max(1, math.Round(perSec*60))), expr.LimitTimeMinute, 1
}

// jobLimitChain returns the chain of the flow limits of job id.
func jobLimitChain(t *nftables.Table, id jobs.ID) *nftables.Chain {
	return &nftables.Chain{Name: "limits_" + string(id), Table: t}
}

// jobLimitJumps are the rules of job_limits that send the packets of each
// of job id's addresses to its chain.
func (r ruleset) jobLimitJumps(id jobs.ID, addrs []netip.Addr) [][]expr.Any {
	ch := jobLimitChain(nil, id).Name
	var rules [][]expr.Any
	for _, a := range addrs {
		f := famOf(a)
		rules = append(rules, cat(f.match(), addrMatch(true, expr.CmpOpEq, netip.PrefixFrom(a, f.Bits)), []expr.Any{jump(ch)}))
	}
	return rules
}

// jobLimitRules are the flow limit rules of a job's own chain (none for a
// job without flow limits).
func (r ruleset) jobLimitRules(l limits.Job) [][]expr.Any {
	match := ctState(expr.CtStateBitNEW)
	var rules [][]expr.Any
	if l.MaxFlows > 0 {
		rules = append(rules, cat(match, []expr.Any{
			&expr.Connlimit{Count: uint32(l.MaxFlows), Flags: connlimitInvert},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainOverFlows},
		}))
	}
	if l.NewFlowsPerSec > 0 {
		rate, unit, burst := newFlowsLimit(l.NewFlowsPerSec)
		rules = append(rules, cat(match, []expr.Any{
			&expr.Limit{Type: expr.LimitTypePkts, Rate: rate, Unit: unit, Burst: burst, Over: true},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainOverRate},
		}))
	}
	return rules
}

// SetJobLimits implements forward.Backend: it replaces the job's flow
// limit rules and its tc classes, for all its addresses.
func (f *Forwarder) SetJobLimits(id jobs.ID, l limits.Job) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("kernel egress: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	kj, ok := f.jobs[id]
	if !ok {
		return fmt.Errorf("kernel egress: set limits of %s: %w", id, forward.ErrUnknownJob)
	}
	if err := f.dnsLimits.SetJob(kj.addrs, dnsfwd.Limits{MaxInflight: l.DNSMaxInflight, PerSec: l.DNSQueriesPerSec}); err != nil {
		return fmt.Errorf("kernel egress: %w", err)
	}
	if err := f.setFlowLimitsLocked(id, kj, l); err != nil {
		return err
	}
	if l.EgressBitsPerSec == 0 && l.IngressBitsPerSec == 0 && f.tc == nil {
		return nil
	}
	if err := f.ensureShaperLocked(); err != nil {
		return err
	}
	return f.tc.setJob(id, kj.addrs, l.EgressBitsPerSec, l.IngressBitsPerSec)
}

// setFlowLimitsLocked replaces the job's chain and its jumps in
// job_limits.
func (f *Forwarder) setFlowLimitsLocked(id jobs.ID, kj *kjob, l limits.Job) error {
	t := table()
	limits, _, _ := limitChains(t)
	old := kj.limits
	tag := limitTag(id)
	rules := f.rules.jobLimitRules(l)
	if len(old) == 0 && len(rules) == 0 {
		return nil
	}
	ch := jobLimitChain(t, id)
	for _, r := range old {
		if err := f.nft.DelRule(r); err != nil {
			return err
		}
	}
	switch {
	case len(old) > 0 && len(rules) == 0:
		f.nft.FlushChain(ch)
		f.nft.DelChain(ch)
	case len(old) > 0:
		f.nft.FlushChain(ch)
	default:
		f.nft.AddChain(ch)
	}
	if len(rules) > 0 {
		for _, e := range rules {
			f.nft.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e})
		}
		for _, e := range f.rules.jobLimitJumps(id, kj.addrs) {
			f.nft.AddRule(&nftables.Rule{Table: t, Chain: limits, Exprs: e, UserData: tag})
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: set flow limits of %s: %w", id, err)
	}
	kj.limits = nil
	if len(rules) == 0 {
		return nil
	}
	var err error
	kj.limits, err = f.taggedLocked(limits, tag)
	return err
}

// removeLimitsLocked deletes the job's limits; errors are logged.
func (f *Forwarder) removeLimitsLocked(id jobs.ID, kj *kjob) {
	if rules := kj.limits; len(rules) > 0 {
		kj.limits = nil
		for _, r := range rules {
			if err := f.nft.DelRule(r); err != nil {
				f.log.Error("kernel egress: delete flow limit rule", "job", id, "err", err)
			}
		}
		ch := jobLimitChain(table(), id)
		f.nft.FlushChain(ch)
		f.nft.DelChain(ch)
		if err := f.nft.Flush(); err != nil {
			f.log.Error("kernel egress: delete flow limit rules", "job", id, "err", err)
		}
	}
	if f.tc != nil {
		if err := f.tc.removeJob(id); err != nil {
			f.log.Error("kernel egress: delete the job's tc classes", "job", id, "err", err)
		}
	}
}

// ensureShaperLocked sets up the qdiscs on first use.
func (f *Forwarder) ensureShaperLocked() error {
	if f.tc != nil {
		return nil
	}
	tc, err := newTCShaper(f.tunName, f.log)
	if err != nil {
		return err
	}
	f.tc = tc
	return nil
}

// SetGlobalLimits implements forward.Backend.
func (f *Forwarder) SetGlobalLimits(egressBitsPerSec, ingressBitsPerSec uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	if egressBitsPerSec == 0 && ingressBitsPerSec == 0 && f.tc == nil {
		return nil
	}
	if err := f.ensureShaperLocked(); err != nil {
		return err
	}
	return f.tc.setGlobal(egressBitsPerSec, ingressBitsPerSec)
}

// limitStats returns the limits' counters (Stats.Limits): the counters of the over_flows
// and over_rate chains and the shapers' queue drops.
func (f *Forwarder) limitStats() (limits.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return limits.Stats{}, errClosed
	}
	var st limits.Stats
	t := table()
	_, overFlows, overRate := limitChains(t)
	for _, c := range []struct {
		chain *nftables.Chain
		dst   *uint64
	}{{overFlows, &st.FlowsRefused}, {overRate, &st.RateRefused}} {
		rules, err := f.nft.GetRules(t, c.chain)
		if err != nil {
			return st, fmt.Errorf("kernel egress: list %s rules: %w", c.chain.Name, err)
		}
		for _, r := range rules {
			for _, x := range r.Exprs {
				if ctr, ok := x.(*expr.Counter); ok {
					*c.dst += ctr.Packets
				}
			}
		}
	}
	if f.tc != nil {
		d, err := f.tc.drops()
		if err != nil {
			return st, err
		}
		st.Dropped = d
	}
	return st, nil
}
