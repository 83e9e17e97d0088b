// SPDX-License-Identifier: MIT

package kernel

// Limits in kernel mode. Theory of operation:
//
// Flow limits are nftables rules in a chain per job with limits,
// limits_JOB, which the chain job_limits (from_jobs jumps to it for every
// packet from a job) jumps to for the job's addresses (`ip saddr JOB jump
// limits_JOB`, and `ip6 saddr JOB6 jump limits_JOB` for its IPv6
// address): `ct state new ct count over N goto over_flows` and `ct state
// new limit rate over R/second burst ⌈R⌉ packets goto over_rate`. One
// chain for both addresses makes one count and one rate for the job's IPv4
// and IPv6 flows together. Both over_ chains count and then refuse like
// any refused flow (TCP reset, ICMP port unreachable for UDP), so the job
// fails at once.
//
// Bandwidth is shaped by HTB qdiscs (tc.go), set up the first time a
// bandwidth limit is set: traffic to jobs on the TUN's own egress,
// classified by destination address; traffic from jobs, which enters the
// host on the TUN's ingress where no qdisc can queue, is redirected to an
// ifb device and shaped on its egress, classified by source address. Each
// direction has a root class at the global rate, a default class for jobs
// without a limit, and one class per limited job whose ceiling is its rate.
// A queue that fills drops, and TCP backs off; HTB holds TCP to its
// ceiling within a few per cent.

import (
	"bytes"
	"fmt"
	"math"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/forward"
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

// limitTag marks the flow limit rules of the job at addr.
func limitTag(addr netip.Addr) []byte { return []byte(limitTagPrefix + addr.String()) }

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

// jobLimitChain returns the chain of the flow limits of the job at addr.
func jobLimitChain(t *nftables.Table, addr netip.Addr) *nftables.Chain {
	return &nftables.Chain{Name: "limits_" + addr.String(), Table: t}
}

// jobLimitJumps are the rules of job_limits that send the packets of the
// job at addr (and addr6, if valid) to its chain.
func (r ruleset) jobLimitJumps(addr, addr6 netip.Addr) [][]expr.Any {
	ch := jobLimitChain(nil, addr).Name
	rules := [][]expr.Any{cat(nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(true, expr.CmpOpEq, netip.PrefixFrom(addr, 32)), []expr.Any{jump(ch)})}
	if addr6.IsValid() {
		rules = append(rules, cat(nfproto6(), ip6(true, expr.CmpOpEq, netip.PrefixFrom(addr6, 128)), []expr.Any{jump(ch)}))
	}
	return rules
}

// jobLimitRules are the flow limit rules of the job at addr, for its own
// chain (none for a job without flow limits).
func (r ruleset) jobLimitRules(addr netip.Addr, l limits.Job) [][]expr.Any {
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
// limit rules and its tc classes.
func (f *Forwarder) SetJobLimits(job netip.Addr, l limits.Job) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("kernel egress: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	if _, ok := f.jobs[job]; !ok {
		return fmt.Errorf("kernel egress: set limits of %v: %w", job, forward.ErrUnknownJob)
	}
	if f.dns != nil {
		if err := f.dns.SetJobLimits(job, dnsfwd.Limits{MaxInflight: l.DNSMaxInflight, PerSec: l.DNSQueriesPerSec}); err != nil {
			return fmt.Errorf("kernel egress: %w", err)
		}
	}
	if j6, ok := f.jobs6[job]; ok && f.dns6 != nil {
		if err := f.dns6.SetJobLimits(j6.addr, dnsfwd.Limits{MaxInflight: l.DNSMaxInflight, PerSec: l.DNSQueriesPerSec}); err != nil {
			return fmt.Errorf("kernel egress: %w", err)
		}
	}
	if err := f.setFlowLimitsLocked(job, l); err != nil {
		return err
	}
	if l.EgressBitsPerSec == 0 && l.IngressBitsPerSec == 0 && f.tc == nil {
		return nil
	}
	if err := f.ensureShaperLocked(); err != nil {
		return err
	}
	return f.tc.setJob(job, f.jobs6[job].addr, l.EgressBitsPerSec, l.IngressBitsPerSec)
}

// setFlowLimitsLocked replaces the job's chain and its jumps in
// job_limits.
func (f *Forwarder) setFlowLimitsLocked(job netip.Addr, l limits.Job) error {
	t := table()
	limits, _, _ := limitChains(t)
	old := f.limitRules[job]
	tag := limitTag(job)
	rules := f.rules.jobLimitRules(job, l)
	if len(old) == 0 && len(rules) == 0 {
		return nil
	}
	ch := jobLimitChain(t, job)
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
		for _, e := range f.rules.jobLimitJumps(job, f.jobs6[job].addr) {
			f.nft.AddRule(&nftables.Rule{Table: t, Chain: limits, Exprs: e, UserData: tag})
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: set flow limits of %v: %w", job, err)
	}
	delete(f.limitRules, job)
	if len(rules) == 0 {
		return nil
	}
	all, err := f.nft.GetRules(t, limits)
	if err != nil {
		return fmt.Errorf("kernel egress: list limit rules: %w", err)
	}
	for _, r := range all {
		if bytes.Equal(r.UserData, tag) {
			f.limitRules[job] = append(f.limitRules[job], r)
		}
	}
	return nil
}

// removeLimitsLocked deletes the job's limits; errors are logged.
func (f *Forwarder) removeLimitsLocked(job netip.Addr) {
	if rules := f.limitRules[job]; len(rules) > 0 {
		delete(f.limitRules, job)
		for _, r := range rules {
			if err := f.nft.DelRule(r); err != nil {
				f.log.Error("kernel egress: delete flow limit rule", "job", job, "err", err)
			}
		}
		ch := jobLimitChain(table(), job)
		f.nft.FlushChain(ch)
		f.nft.DelChain(ch)
		if err := f.nft.Flush(); err != nil {
			f.log.Error("kernel egress: delete flow limit rules", "job", job, "err", err)
		}
	}
	if f.tc != nil {
		if err := f.tc.removeJob(job); err != nil {
			f.log.Error("kernel egress: delete the job's tc classes", "job", job, "err", err)
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
