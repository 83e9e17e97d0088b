// SPDX-License-Identifier: MIT

package kernel

// Policy in kernel mode. Theory of operation:
//
// The site's egress policy (package policy) is compiled into two chains
// that the fixed rules jump to:
//
//	chain egress_policy from from_jobs (forwarded traffic), after the floor,
//	                    for packets of no established flow (ct state):
//	    per policy rule, in order, per IPv4 prefix (and per protocol when
//	    ports are given for "any": tcp and udp):
//	      [ip saddr @scopeG_I] [meta l4proto P] [th dport LO-HI] ip daddr PFX
//	      [ip daddr != PROTECTED ...]      (allow rules that do not name
//	                                        a protected range inside PFX)
//	      allow: return                     deny: counter goto policy_deny
//	    per protected IPv4 range of policy.Ranges, most specific first:
//	    ip daddr 169.254.169.254 counter goto policy_deny     builtin-metadata
//	    ip daddr 100.64.0.0/10 counter goto policy_deny       builtin-internal
//	    ip daddr 169.254.0.0/16 counter goto policy_deny      builtin-link-local
//	    ip daddr 10/8, 172.16/12, 192.168/16 counter goto policy_deny  builtin-private
//	    counter goto policy_deny                               default (if deny)
//	chain host_policy   from to_host (traffic to the gateway host's own
//	                    addresses), after DNS and ping to the tunnel address:
//	    ip daddr GW return                 (to_host refuses it)
//	    the deny rules as above; allow rules only with a single address
//	    (/32), as accept
//	    counter goto policy_deny                               builtin-host
//	chain policy_deny   tcp: reject with tcp reset; else drop
//
// Deny rules carry a counter and the user data "airlock policy NAME", so
// policyDrops (Stats.PolicyDrops) sums them by rule name. Token-scoped
// rules match the source against a set per rule (scopeG_I, generation G,
// rule I) holding the addresses of the jobs whose token the rule names;
// AddJob (setJobToken) and RemoveJob add and delete elements.
//
// SetPolicy replaces both chains' rules and the scope sets in one netlink
// batch, which nf_tables applies as one transaction: packets see the old
// rules or the new ones, never a mix. The old sets are deleted in a second
// batch. The counters of the old rules are added to a carried-over total
// first, so counts do not go down.
//
// IPv6 rules are the same with ip6 matches (and ICMPv6 for icmp); the
// built-in list's IPv6 entries and the images of its IPv4 entries in the
// IPv4-embedding forms are compiled as embed_linux.go describes. A rule
// without prefixes applies to both families. Without an IPv6 tunnel
// address IPv6 prefixes are skipped: from_jobs drops IPv6.

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Names of the policy chains and tags.
const (
	chainPolicy     = "egress_policy"
	chainPolicyHost = "host_policy"
	chainPolicyDeny = "policy_deny"
	policyTagPrefix = "airlock policy "
)

// policyChains returns the policy chains.
func policyChains(t *nftables.Table) (pol, host, deny *nftables.Chain) {
	return &nftables.Chain{Name: chainPolicy, Table: t},
		&nftables.Chain{Name: chainPolicyHost, Table: t},
		&nftables.Chain{Name: chainPolicyDeny, Table: t}
}

// policyDenyRules reset denied TCP and drop the rest, as user mode does.
func policyDenyRules() [][]expr.Any {
	return [][]expr.Any{
		cat(l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}),
		{verdict(expr.VerdictDrop)},
	}
}

// policyRule is one nftables rule of a compiled policy.
type policyRule struct {
	// tag names the policy rule it counts for ("" for allow rules, which
	// count nothing).
	tag   string
	exprs []expr.Any
}

// scopeSet is the sets (one per family the ruleset forwards) of the job
// addresses a token-scoped rule applies to.
type scopeSet struct {
	sets   [ipfamily.N]*nftables.Set // nil for a family not forwarded
	tokens []string
}

// compiledPolicy is a policy turned into rules of the egress_policy and
// host_policy chains.
type compiledPolicy struct {
	pol        *policy.Policy
	main, host []policyRule
	// scopes holds the set of each token-scoped rule, by rule index.
	scopes map[int]*scopeSet
}

// compilePolicy builds the rules of p for table t; sets are named with
// generation gen. It touches no kernel state.
func (r ruleset) compilePolicy(t *nftables.Table, p *policy.Policy, gen int) *compiledPolicy {
	c := &compiledPolicy{pol: p, scopes: map[int]*scopeSet{}}
	denyTo := func() []expr.Any {
		return []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainPolicyDeny}}
	}
	fams := r.families()
	for _, f := range fams {
		c.host = append(c.host, policyRule{exprs: cat(f.match(),
			addrMatch(false, expr.CmpOpEq, netip.PrefixFrom(r.tunnels[f.Index].Addr(), f.Bits)), []expr.Any{verdict(expr.VerdictReturn)})})
	}
	for i, rule := range p.Rules {
		var scope [ipfamily.N][]expr.Any
		if len(rule.Tokens) > 0 {
			s := &scopeSet{tokens: rule.Tokens}
			for _, f := range fams {
				s.sets[f.Index] = &nftables.Set{Table: t, Name: fmt.Sprintf("%s%d_%d", f.scope, gen, i), KeyType: f.addrType}
				scope[f.Index] = []expr.Any{
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: uint32(f.SrcOff), Len: uint32(f.Bits / 8)},
					&expr.Lookup{SourceRegister: 1, SetName: s.sets[f.Index].Name},
				}
			}
			c.scopes[i] = s
		}
		// The rule's prefixes by family; none means all of every family.
		var prefixes [ipfamily.N][]netip.Prefix
		for _, pf := range rule.To {
			f := ipfamily.Of(pf.Addr())
			prefixes[f.Index] = append(prefixes[f.Index], pf)
		}
		// One pass per address family: its match, scope, ICMP protocol,
		// prefixes and how an allow rule leaves out protected ranges.
		for _, f := range fams {
			pfs := prefixes[f.Index]
			if len(rule.To) == 0 {
				pfs = []netip.Prefix{f.All}
			}
			for _, pm := range protoMatches(rule, f.ICMP) {
				for _, pf := range pfs {
					base := cat(f.match(), scope[f.Index], pm)
					if pf.Bits() > 0 {
						base = cat(base, addrMatch(false, expr.CmpOpEq, pf))
					}
					if rule.Action == policy.Deny {
						e := cat(base, denyTo())
						c.main = append(c.main, policyRule{tag: rule.Name, exprs: e})
						c.host = append(c.host, policyRule{tag: rule.Name, exprs: e})
						continue
					}
					for _, dst := range allowDsts(pf) {
						c.main = append(c.main, policyRule{exprs: cat(f.match(), scope[f.Index], pm, dst, []expr.Any{verdict(expr.VerdictReturn)})})
					}
					if pf.Bits() == f.Bits {
						c.host = append(c.host, policyRule{exprs: cat(base, []expr.Any{verdict(expr.VerdictAccept)})})
					}
				}
			}
		}
	}
	for _, pr := range protectedV4() {
		c.main = append(c.main, policyRule{tag: pr.Rule, exprs: cat(v4Family.match(), addrMatch(false, expr.CmpOpEq, pr.Prefix), denyTo())})
	}
	if r.has(ipfamily.V6) {
		for _, d := range denyConds() {
			c.main = append(c.main, policyRule{tag: d.rule, exprs: cat(v6Family.match(), condExprs(d.conds), denyTo())})
		}
	}
	if p.Default == policy.Deny {
		c.main = append(c.main, policyRule{tag: policy.RuleDefault, exprs: denyTo()})
	}
	c.host = append(c.host, policyRule{tag: policy.RuleHost, exprs: denyTo()})
	return c
}

// allowDsts returns the destination matches of an allow rule for prefix
// pf, one per nftables rule: pf without the protected ranges it does not
// name (IPv4: unnamedV4; IPv6: allowConds).
func allowDsts(pf netip.Prefix) [][]expr.Any {
	if pf.Addr().Is6() {
		var out [][]expr.Any
		for _, conds := range allowConds(pf) {
			out = append(out, condExprs(conds))
		}
		return out
	}
	var e []expr.Any
	if pf.Bits() > 0 {
		e = addrMatch(false, expr.CmpOpEq, pf)
	}
	for _, prot := range unnamedV4(pf) {
		e = cat(e, addrMatch(false, expr.CmpOpNeq, prot))
	}
	return [][]expr.Any{e}
}

// protectedV4 lists the IPv4 ranges of the built-in list that only an
// explicit allow opens (policy.Builtin), most specific first, so that the
// deny rules count a destination under the rule policy.Decide names.
func protectedV4() []policy.Range {
	var out []policy.Range
	for _, r := range policy.Ranges() {
		if r.Prefix.Addr().Is4() && r.Rule != "" && r.Rule != policy.RuleFloor {
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Prefix.Bits() > out[j].Prefix.Bits() })
	return out
}

// unnamedV4 returns the protected IPv4 ranges strictly inside an allow
// rule's prefix pf, which the rule does not name and so must not open:
// only the outermost ones (a range inside another of them is excluded
// with it).
func unnamedV4(pf netip.Prefix) []netip.Prefix {
	var in []netip.Prefix
	for _, r := range protectedV4() {
		if pf.Bits() < r.Prefix.Bits() && pf.Contains(r.Prefix.Addr()) {
			in = append(in, r.Prefix)
		}
	}
	var out []netip.Prefix
	for _, p := range in {
		inner := false
		for _, q := range in {
			if q.Bits() < p.Bits() && q.Contains(p.Addr()) {
				inner = true
				break
			}
		}
		if !inner {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr().Less(out[j].Addr()) })
	return out
}

// protoMatches returns the protocol and port matches of a rule: one
// alternative per nftables rule. icmp is the protocol number that
// ProtoICMP stands for (the family's: ICMP or ICMPv6).
func protoMatches(r policy.Rule, icmp byte) [][]expr.Any {
	protos := map[policy.Proto]byte{policy.ProtoTCP: unix.IPPROTO_TCP, policy.ProtoUDP: unix.IPPROTO_UDP, policy.ProtoICMP: icmp}
	if len(r.Ports) == 0 {
		if r.Proto == policy.ProtoAny {
			return [][]expr.Any{nil}
		}
		return [][]expr.Any{l4proto(protos[r.Proto])}
	}
	var ps []byte
	if r.Proto == policy.ProtoAny {
		ps = []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP}
	} else {
		ps = []byte{protos[r.Proto]}
	}
	var out [][]expr.Any
	for _, p := range ps {
		for _, pr := range r.Ports {
			out = append(out, cat(l4proto(p), dportRange(pr)))
		}
	}
	return out
}

// dportRange matches the transport destination port against a range.
func dportRange(pr portblock.Range) []expr.Any {
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if pr.Lo == pr.Hi {
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(pr.Lo)}}
	}
	return []expr.Any{load, &expr.Range{Op: expr.CmpOpEq, Register: 1,
		FromData: binaryutil.BigEndian.PutUint16(pr.Lo), ToData: binaryutil.BigEndian.PutUint16(pr.Hi)}}
}

// policyTag is the user data of a counted policy rule.
func policyTag(name string) []byte { return []byte(policyTagPrefix + name) }

// queuePolicyLocked adds c's sets (with the current jobs of their tokens)
// and rules to the pending batch.
func (f *Forwarder) queuePolicyLocked(t *nftables.Table, c *compiledPolicy) error {
	pol, host, _ := policyChains(t)
	for _, s := range c.scopes {
		var els [ipfamily.N][]nftables.SetElement
		for _, kj := range f.jobs {
			if slices.Contains(s.tokens, kj.token) {
				for _, a := range kj.addrs {
					els[famOf(a).Index] = append(els[famOf(a).Index], nftables.SetElement{Key: a.AsSlice()})
				}
			}
		}
		for i, set := range s.sets {
			if set == nil {
				continue
			}
			if err := f.nft.AddSet(set, els[i]); err != nil {
				return fmt.Errorf("kernel egress: add set %s: %w", set.Name, err)
			}
		}
	}
	add := func(ch *nftables.Chain, rules []policyRule) {
		for _, r := range rules {
			ex := make([]expr.Any, len(r.exprs))
			copy(ex, r.exprs)
			for i, e := range ex { // point lookups at this batch's sets
				if l, ok := e.(*expr.Lookup); ok {
					for _, s := range c.scopes {
						for _, set := range s.sets {
							if set != nil && set.Name == l.SetName {
								ex[i] = &expr.Lookup{SourceRegister: l.SourceRegister, SetName: set.Name, SetID: set.ID}
							}
						}
					}
				}
			}
			nr := &nftables.Rule{Table: t, Chain: ch, Exprs: ex}
			if r.tag != "" {
				nr.UserData = policyTag(r.tag)
			}
			f.nft.AddRule(nr)
		}
	}
	add(pol, c.main)
	add(host, c.host)
	return nil
}

// SetPolicy implements forward.Backend: it replaces the policy chains'
// rules and scope sets atomically.
func (f *Forwarder) SetPolicy(p *policy.Policy) error {
	if p == nil {
		p = &policy.Policy{}
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("kernel egress: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	t := table()
	counts, err := f.policyCountsLocked(false)
	if err != nil {
		return err
	}
	f.policyGen++
	c := f.rules.compilePolicy(t, p, f.policyGen)
	pol, host, _ := policyChains(t)
	f.nft.FlushChain(pol)
	f.nft.FlushChain(host)
	if err := f.queuePolicyLocked(t, c); err != nil {
		return err
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: program policy: %w", err)
	}
	for k, v := range counts {
		f.policyCarried[k] = v
	}
	old := f.policy
	f.policy = c
	if old != nil && len(old.scopes) > 0 {
		for _, s := range old.scopes {
			for _, set := range s.sets {
				if set != nil {
					f.nft.DelSet(set)
				}
			}
		}
		if err := f.nft.Flush(); err != nil {
			f.log.Warn("kernel egress: cannot delete the old policy's scope sets", "err", err)
		}
	}
	return nil
}

// setJobToken adds job id's addresses to the scope sets of the rules
// that name its token.
func (f *Forwarder) setJobToken(id jobs.ID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	kj, ok := f.jobs[id]
	if !ok {
		return fmt.Errorf("kernel egress: set token of %s: %w", id, forward.ErrUnknownJob)
	}
	if n := f.scopeElementsLocked(kj, true); n == 0 {
		return nil
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: add %s to the policy's token sets: %w", id, err)
	}
	return nil
}

// scopeElementsLocked queues adding (or deleting) the job's addresses to
// (from) the scope sets of its token and returns how many it queued.
func (f *Forwarder) scopeElementsLocked(kj *kjob, add bool) int {
	if f.policy == nil {
		return 0
	}
	n := 0
	for _, s := range f.policy.scopes {
		if !slices.Contains(s.tokens, kj.token) {
			continue
		}
		for _, a := range kj.addrs {
			if set := s.sets[famOf(a).Index]; set != nil && f.setElementsLocked(set, []nftables.SetElement{{Key: a.AsSlice()}}, add) {
				n++
			}
		}
	}
	return n
}

// setElementsLocked queues adding (or deleting) els to (from) set s and
// reports whether it did.
func (f *Forwarder) setElementsLocked(s *nftables.Set, els []nftables.SetElement, add bool) bool {
	var err error
	if add {
		err = f.nft.SetAddElements(s, els)
	} else {
		err = f.nft.SetDeleteElements(s, els)
	}
	return err == nil
}

// forgetTokenLocked removes the job from the scope sets (RemoveJob).
func (f *Forwarder) forgetTokenLocked(id jobs.ID, kj *kjob) {
	if n := f.scopeElementsLocked(kj, false); n > 0 {
		if err := f.nft.Flush(); err != nil {
			f.log.Error("kernel egress: delete the job from the policy's token sets", "job", id, "err", err)
		}
	}
}

// policyCountsLocked returns the carried-over counts plus the counters of
// the current policy rules, by rule name, and with floor those of the
// floor chain (which SetPolicy keeps, so it must not carry them over).
func (f *Forwarder) policyCountsLocked(floor bool) (map[string]uint64, error) {
	out := make(map[string]uint64, len(f.policyCarried))
	for k, v := range f.policyCarried {
		out[k] = v
	}
	t := table()
	pol, host, _ := policyChains(t)
	chs := []*nftables.Chain{pol, host}
	if floor {
		chs = append(chs, floorChain(t))
	}
	for _, ch := range chs {
		rules, err := f.nft.GetRules(t, ch)
		if err != nil {
			return nil, fmt.Errorf("kernel egress: list %s rules: %w", ch.Name, err)
		}
		for _, r := range rules {
			name, ok := strings.CutPrefix(string(r.UserData), policyTagPrefix)
			if !ok {
				continue
			}
			for _, x := range r.Exprs {
				if ctr, ok := x.(*expr.Counter); ok {
					out[name] += ctr.Packets
				}
			}
		}
	}
	return out, nil
}

// policyDrops returns the denials per rule (Stats.PolicyDrops), from the rules' nftables
// counters.
func (f *Forwarder) policyDrops() (map[string]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errClosed
	}
	return f.policyCountsLocked(true)
}
