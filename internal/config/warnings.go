// SPDX-License-Identifier: MIT

package config

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Warning is an entry of a valid config that can never take effect: a
// rule an earlier one shadows, a bypass entry the policy denies, a token
// name that no token has. The gateway logs them at start and at every
// reload, and airlock gateway --check prints them.
type Warning struct {
	File string
	// Line is the entry's line, 0 if unknown.
	Line int
	// Key is the entry, e.g. "policy.rule[3]".
	Key     string
	Problem string
	Fix     string
}

func (w Warning) String() string {
	loc := w.File
	if w.Line > 0 {
		loc = fmt.Sprintf("%s:%d", w.File, w.Line)
	}
	return fmt.Sprintf("%s: %s: %s; %s", loc, w.Key, w.Problem, w.Fix)
}

// Warnings returns the entries of c that can never take effect. tokens
// are the names of the tokens that exist; nil skips the check of token
// names (the tokens are not known).
func (c *Config) Warnings(tokens []string) []Warning {
	var out []Warning
	add := func(key, problem, fix string) {
		out = append(out, Warning{File: c.Path, Line: c.lines.find(key), Key: key, Problem: problem, Fix: fix})
	}
	if c.Policy != nil {
		rules := c.Policy.Rules
		for j := range rules {
			for i := range j {
				if shadows(rules[i], rules[j]) {
					add(fmt.Sprintf("policy.rule[%d]", j+1),
						fmt.Sprintf("rule %q never matches: rule %q (policy.rule[%d]) matches every flow it would, first", rules[j].Name, rules[i].Name, i+1),
						fmt.Sprintf("move it above %q, or remove it", rules[i].Name))
					break
				}
			}
		}
		for i, b := range c.Bypass.Rules {
			if rule, dst, ok := deniedForAll(c.Policy, b); ok {
				add(fmt.Sprintf("bypass[%d]", i+1),
					fmt.Sprintf("bypass entry %q does nothing: the policy denies %s for every token (rule %s), and a bypassed flow must be allowed by the policy too", b.Name, dst, rule),
					fmt.Sprintf("add a [[policy.rule]] with action = \"allow\" and to = [\"%s\"] (and the entry's tokens) before any rule that denies it", dstPrefix(b)))
			}
		}
	}
	if tokens != nil {
		for _, ref := range c.tokenRefs() {
			if !slices.Contains(tokens, ref.name) {
				add(ref.key, fmt.Sprintf("token %q does not exist, so this names no job", ref.name),
					"create it (airlock token create --name "+ref.name+"), or fix the name (airlock token list)")
			}
		}
	}
	return out
}

// shadows reports whether every flow that rule b matches is decided by a
// rules before it: a matches at least b's protocols, ports, tokens and
// destinations, and decides them (an allow rule does not decide a
// protected range it does not name, where b may).
func shadows(a, b policy.Rule) bool {
	if a.Proto != policy.ProtoAny && a.Proto != b.Proto {
		return false
	}
	if len(a.Ports) > 0 {
		if len(b.Ports) == 0 {
			return false
		}
		for _, pb := range b.Ports {
			if !slices.ContainsFunc(a.Ports, func(pa portblock.Range) bool { return pa.Lo <= pb.Lo && pb.Hi <= pa.Hi }) {
				return false
			}
		}
	}
	if len(a.Tokens) > 0 {
		if len(b.Tokens) == 0 {
			return false
		}
		for _, t := range b.Tokens {
			if !slices.Contains(a.Tokens, t) {
				return false
			}
		}
	}
	if len(a.To) == 0 {
		return a.Action == policy.Deny || len(b.To) == 0 || !namesProtected(b.To, netip.Prefix{})
	}
	if len(b.To) == 0 {
		return false
	}
	for _, pb := range b.To {
		cover, ok := covering(a.To, pb)
		if !ok {
			return false
		}
		if a.Action == policy.Allow && namesProtected([]netip.Prefix{pb}, cover) {
			return false
		}
	}
	return true
}

// covering returns the most specific of ps that contains all of p.
func covering(ps []netip.Prefix, p netip.Prefix) (netip.Prefix, bool) {
	best, ok := netip.Prefix{}, false
	for _, c := range ps {
		if c.Addr().Is4() == p.Addr().Is4() && c.Bits() <= p.Bits() && c.Contains(p.Addr()) && (!ok || c.Bits() > best.Bits()) {
			best, ok = c, true
		}
	}
	return best, ok
}

// namesProtected reports whether a prefix of ps lies in a built-in
// protected range more specifically than cover does (an allow rule must
// name a protected range to open it; cover invalid: no prefix at all).
func namesProtected(ps []netip.Prefix, cover netip.Prefix) bool {
	for _, p := range ps {
		prot, r := policy.Builtin(p.Addr(), nil, false)
		if prot == "" || prot == policy.RuleFloor {
			continue
		}
		if p.Bits() >= r.Bits() && (!cover.IsValid() || cover.Bits() < r.Bits()) {
			return true
		}
	}
	return false
}

// deniedForAll reports whether p denies bypass entry b's first destination
// for every token b applies to (b's own, else every token a rule names
// and any other), and by which rule.
func deniedForAll(p *policy.Policy, b policy.Rule) (rule, dst string, denied bool) {
	if len(b.To) == 0 {
		return "", "", false
	}
	f := policy.Flow{Proto: b.Proto, Dst: b.To[0].Addr()}
	if f.Proto == policy.ProtoAny {
		f.Proto = policy.ProtoTCP
	}
	if len(b.Ports) > 0 {
		f.Port = b.Ports[0].Lo
	}
	tokens := b.Tokens
	if len(tokens) == 0 {
		tokens = []string{""} // a token no rule names
		for _, r := range p.Rules {
			tokens = append(tokens, r.Tokens...)
		}
	}
	for _, t := range tokens {
		f.Token = t
		v := p.Decide(f)
		if v.Action == policy.Allow {
			return "", "", false
		}
		rule = v.Rule
	}
	dst = f.Dst.String()
	if f.Port != 0 {
		dst = fmt.Sprintf("%s %s/%d", dst, f.Proto, f.Port)
	}
	return rule, dst, true
}

// dstPrefix is b's first destination as written in a rule.
func dstPrefix(b policy.Rule) string { return b.To[0].String() }

// tokenRef is a token name in the config and where.
type tokenRef struct{ key, name string }

// tokenRefs lists every token name the config uses, once per entry.
func (c *Config) tokenRefs() []tokenRef {
	var out []tokenRef
	names := func(key string, ts []string) {
		for _, t := range ts {
			out = append(out, tokenRef{key, t})
		}
	}
	if c.Policy != nil {
		for i, r := range c.Policy.Rules {
			names(fmt.Sprintf("policy.rule[%d]", i+1), r.Tokens)
		}
	}
	for i, r := range c.Bypass.Rules {
		names(fmt.Sprintf("bypass[%d]", i+1), r.Tokens)
	}
	if c.Exposure != nil {
		for i, r := range c.Exposure.Rules {
			names(fmt.Sprintf("expose[%d]", i+1), r.Tokens)
		}
	}
	for i, cp := range c.Capture {
		names(fmt.Sprintf("capture[%d]", i+1), cp.Tokens)
	}
	for _, t := range sortedKeys(c.Limits.Tokens) {
		out = append(out, tokenRef{"limits.token." + t, t})
	}
	for _, t := range sortedKeys(c.Quotas.Tokens) {
		out = append(out, tokenRef{"quota.token." + t, t})
	}
	return out
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
