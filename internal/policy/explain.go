// SPDX-License-Identifier: MIT

package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Explanation is Explain's answer: the verdict Decide gives and the steps
// that led to it, for a human (airlock policy explain, failed
// [[policy.test]] entries).
type Explanation struct {
	Verdict Verdict
	// Index is the deciding rule's index in Policy.Rules, -1 for a
	// built-in rule or the default.
	Index int
	// Protected is the built-in range that holds the destination, if any
	// ("" Rule when none): an allow rule must name it.
	Protected Range
	// Steps say, in order, why each rule before the deciding one did not
	// decide, and why the deciding one did.
	Steps []string
}

// Explain returns what Decide returns for f, with the reasons. It walks
// the rules as Decide does (a test keeps the two in step); unlike Decide
// it allocates, and is for humans, not for the data path.
func (p *Policy) Explain(f Flow) Explanation {
	dst := f.Dst.Unmap()
	prot, prange := Builtin(dst, f.Tunnels, f.Host)
	e := Explanation{Index: -1}
	if prot != "" {
		e.Protected = Range{Prefix: prange, Rule: prot, Name: rangeName(prange, prot)}
	}
	if prot == RuleFloor {
		e.Verdict = Verdict{Deny, RuleFloor}
		e.Steps = append(e.Steps, fmt.Sprintf("%s is in %s (%s), which no rule can open", dst, prange, e.Protected.Name))
		return e
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if why := r.mismatch(f); why != "" {
			e.Steps = append(e.Steps, fmt.Sprintf("rule %q does not match: %s", r.Name, why))
			continue
		}
		pf, ok := r.dstPrefix(dst)
		if !ok {
			e.Steps = append(e.Steps, fmt.Sprintf("rule %q does not match: %s is in none of its destinations %s", r.Name, dst, prefixList(r.To)))
			continue
		}
		if r.Action == Allow && prot != "" && !(pf.Bits() >= prange.Bits() && prange.Contains(pf.Addr())) {
			e.Steps = append(e.Steps, fmt.Sprintf("rule %q matches but does not decide: an allow rule opens %s (%s, %s) only if it names that range or a part of it, and its %s does not",
				r.Name, prange, e.Protected.Name, prot, pf))
			continue
		}
		e.Verdict, e.Index = Verdict{r.Action, r.Name}, i
		e.Steps = append(e.Steps, fmt.Sprintf("rule %q decides: %s", r.Name, r.matchReason(f, dst, pf)))
		return e
	}
	if prot != "" {
		e.Verdict = Verdict{Deny, prot}
		e.Steps = append(e.Steps, fmt.Sprintf("no rule allows it by name, so the built-in %s denies %s: it is in %s (%s)", prot, dst, prange, e.Protected.Name))
		return e
	}
	e.Verdict = Verdict{p.Default, RuleDefault}
	e.Steps = append(e.Steps, fmt.Sprintf("no rule matches, so the policy's default (%s) decides", p.Default))
	return e
}

// mismatch says why r does not match f apart from the destination
// address, "" if it matches.
func (r *Rule) mismatch(f Flow) string {
	if r.Proto != ProtoAny && r.Proto != f.Proto {
		return fmt.Sprintf("it is for %s, the flow is %s", r.Proto, f.Proto)
	}
	if len(r.Ports) > 0 {
		if f.Proto != ProtoTCP && f.Proto != ProtoUDP {
			return fmt.Sprintf("it names ports, and %s has none", f.Proto)
		}
		if !slices.ContainsFunc(r.Ports, func(pr portblock.Range) bool { return pr.Contains(f.Port) }) {
			return fmt.Sprintf("port %d is not in %s", f.Port, portList(r))
		}
	}
	if len(r.Tokens) > 0 && !slices.Contains(r.Tokens, f.Token) {
		tok := fmt.Sprintf("token %q", f.Token)
		if f.Token == "" {
			tok = "no token name"
		}
		return fmt.Sprintf("it is for tokens %s, the job has %s", strings.Join(quoteAll(r.Tokens), ", "), tok)
	}
	return ""
}

// matchReason says why r, which matches f, does.
func (r *Rule) matchReason(f Flow, dst netip.Addr, pf netip.Prefix) string {
	var parts []string
	if len(r.To) == 0 {
		parts = append(parts, "it names no destination (every one)")
	} else {
		parts = append(parts, fmt.Sprintf("%s is in %s", dst, pf))
	}
	if r.Proto != ProtoAny {
		parts = append(parts, fmt.Sprintf("protocol %s", r.Proto))
	}
	if len(r.Ports) > 0 {
		parts = append(parts, fmt.Sprintf("port %d in %s", f.Port, portList(r)))
	}
	if len(r.Tokens) > 0 {
		parts = append(parts, fmt.Sprintf("token %q listed", f.Token))
	}
	return r.Action.String() + ", as " + strings.Join(parts, ", ")
}

func portList(r *Rule) string {
	s := make([]string, len(r.Ports))
	for i, pr := range r.Ports {
		s[i] = pr.String()
		if pr.Lo == pr.Hi {
			s[i] = fmt.Sprint(pr.Lo)
		}
	}
	return strings.Join(s, ",")
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// rangeName says what the built-in range p of rule is.
func rangeName(p netip.Prefix, rule string) string {
	for _, r := range ranges {
		if r.Prefix == p {
			return r.Name
		}
	}
	switch rule {
	case RuleHost:
		return "the gateway host's own address"
	case RuleFloor:
		return "the gateway's tunnel subnet"
	}
	return "the image of a protected IPv4 range in an IPv6 address that embeds it"
}
