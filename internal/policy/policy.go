// SPDX-License-Identifier: MIT

// Package policy decides which of a job's flows may leave the gateway:
// ordered allow/deny rules on destination prefix, protocol and port range,
// optionally scoped to join token names, first match wins, then a default
// verdict; under them, built-in protections of the gateway host and of
// every non-global destination that leads somewhere internal (link-local,
// private, shared and reserved space, cloud metadata endpoints, and IPv6
// addresses that embed such an IPv4 address) that only an allow rule
// naming the range explicitly can lift. The list and the one function that
// applies it are in floor.go.
//
// # Theory of operation
//
// [Policy.Decide] evaluates one new flow ([Flow]) in this order:
//
//  1. The floor: loopback, unspecified, multicast and broadcast destinations
//     and the gateway's tunnel subnet are denied whatever the rules say
//     (rule name [RuleFloor]; [Builtin]). No backend can forward them: the
//     kernel drops them as martians, the user-mode gateway would reach its
//     own loopback, and jobs must not reach each other.
//  2. The rules, in order; the first that matches decides. A deny rule
//     matches every destination in its prefixes. An allow rule matches a
//     protected destination only if it names the protected range
//     explicitly: its prefix that holds the destination lies inside the
//     protected range (10.1.0.0/16 names part of 10.0.0.0/8; 0.0.0.0/0
//     does not), and for the gateway host's own addresses it is the single
//     address (/32, /128).
//  3. If no rule matched: a protected destination is denied by its
//     built-in rule ([RuleHost], [RuleLinkLocal], [RulePrivate],
//     [RuleInternal], [RuleMetadata]); any other gets the default verdict
//     ([RuleDefault]).
//
// A Policy is immutable once built and safe for concurrent use. Drop
// counters live apart from it, in [Counters], keyed by rule name, so that a
// reloaded policy keeps counting under the same names.
package policy

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Action is a rule's or the default verdict.
type Action uint8

// Actions.
const (
	Allow Action = iota
	Deny
)

func (a Action) String() string {
	if a == Deny {
		return "deny"
	}
	return "allow"
}

// ParseAction parses "allow" or "deny".
func ParseAction(s string) (Action, error) {
	switch s {
	case "allow":
		return Allow, nil
	case "deny":
		return Deny, nil
	}
	return Allow, fmt.Errorf("action %q: want allow or deny", s)
}

// Proto is a rule's or a flow's protocol: Airlock's one protocol type.
type Proto = ipproto.Proto

// Protocols. ProtoAny only appears in rules.
const (
	ProtoAny  = ipproto.Any
	ProtoTCP  = ipproto.TCP
	ProtoUDP  = ipproto.UDP
	ProtoICMP = ipproto.ICMP // ICMP and ICMPv6 (echo)
)

// ParseProto parses "tcp", "udp", "icmp" or "any" ("" is any).
func ParseProto(s string) (Proto, error) { return ipproto.Parse(s) }

// Names of the built-in rules, as Verdict.Rule and in Counters.
const (
	RuleFloor     = "builtin-floor"      // loopback, unspecified, multicast, broadcast, the tunnel subnet
	RuleHost      = "builtin-host"       // the gateway host's own addresses
	RuleLinkLocal = "builtin-link-local" // 169.254.0.0/16, fe80::/10
	RulePrivate   = "builtin-private"    // RFC 1918, fc00::/7
	RuleDefault   = "default"            // no rule matched
)

// Rule is one allow or deny rule. The zero value of each match field
// matches everything: no To means every destination, ProtoAny every
// protocol, no Ports every port, no Tokens every token.
type Rule struct {
	// Name identifies the rule in logs and counters; unique in a Policy.
	Name   string
	Action Action
	// To are destination prefixes (IPv4 or IPv6), masked.
	To []netip.Prefix
	// Proto restricts the rule to one protocol.
	Proto Proto
	// Ports restricts the rule to TCP and UDP flows to these destination
	// ports (Proto must not be ProtoICMP).
	Ports []portblock.Range
	// Tokens restricts the rule to jobs that joined with these token
	// names.
	Tokens []string
}

// Policy is an ordered rule list with a default verdict. Build it, call
// Validate, then treat it as immutable. The zero value allows every flow
// that no built-in protection denies.
type Policy struct {
	Default Action
	Rules   []Rule
}

// Flow is what Decide needs to know about a new flow.
type Flow struct {
	// Token is the name of the token the job joined with.
	Token string
	Proto Proto // TCP, UDP or ICMP
	Dst   netip.Addr
	// Port is the destination port (0 for ICMP).
	Port uint16
	// Host reports that Dst (or an IPv4 address it embeds, see Embedded)
	// is one of the gateway host's own addresses.
	Host bool
	// Tunnels are the gateway's tunnel subnets (at most one per family);
	// the floor closes all of them.
	Tunnels []netip.Prefix
}

// Verdict is Decide's answer.
type Verdict struct {
	Action Action
	// Rule names the rule that decided: a Rule's Name or one of the
	// built-in names.
	Rule string
}

// Validate checks p: names unique and not reserved, prefixes masked, port
// ranges sane, no ports with ICMP.
func (p *Policy) Validate() error {
	seen := map[string]bool{}
	for i, r := range p.Rules {
		if err := r.validate(); err != nil {
			return fmt.Errorf("rule %d (%s): %w", i+1, r.Name, err)
		}
		if seen[r.Name] {
			return fmt.Errorf("rule %d: name %q used twice", i+1, r.Name)
		}
		seen[r.Name] = true
	}
	return nil
}

func (r Rule) validate() error {
	if err := ValidateName(r.Name); err != nil {
		return err
	}
	for _, pf := range r.To {
		if !pf.IsValid() || pf != pf.Masked() {
			return fmt.Errorf("prefix %v: want a masked prefix such as %v", pf, pf.Masked())
		}
	}
	if len(r.Ports) > 0 && r.Proto == ProtoICMP {
		return fmt.Errorf("ports with protocol icmp: ICMP has no ports")
	}
	for _, pr := range r.Ports {
		if pr.Lo == 0 || pr.Lo > pr.Hi {
			return fmt.Errorf("port range %d-%d: want 1 <= LO <= HI <= 65535", pr.Lo, pr.Hi)
		}
	}
	return nil
}

// ValidateName checks a rule name: 1-64 characters from a-z A-Z 0-9 . _ -,
// not starting with "builtin" and not "default".
func ValidateName(n string) error {
	if n == "" || len(n) > 64 {
		return fmt.Errorf("rule name %q: want 1 to 64 characters", n)
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("rule name %q: want characters from a-z A-Z 0-9 . _ -", n)
		}
	}
	if strings.HasPrefix(n, "builtin") || n == RuleDefault {
		return fmt.Errorf("rule name %q is reserved for built-in rules", n)
	}
	return nil
}

// Decide returns the verdict for a new flow. It allocates nothing.
func (p *Policy) Decide(f Flow) Verdict {
	dst := f.Dst.Unmap()
	prot, prange := Builtin(dst, f.Tunnels, f.Host)
	if prot == RuleFloor {
		return Verdict{Deny, RuleFloor}
	}
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.matchesFlow(f) {
			continue
		}
		pf, ok := r.dstPrefix(dst)
		if !ok {
			continue
		}
		if r.Action == Deny {
			return Verdict{Deny, r.Name}
		}
		if prot != "" && !(pf.Bits() >= prange.Bits() && prange.Contains(pf.Addr())) {
			continue // allow that does not name the protected range
		}
		return Verdict{Allow, r.Name}
	}
	if prot != "" {
		return Verdict{Deny, prot}
	}
	return Verdict{p.Default, RuleDefault}
}

// matchesFlow checks everything but the destination address.
func (r *Rule) matchesFlow(f Flow) bool {
	if r.Proto != ProtoAny && r.Proto != f.Proto {
		return false
	}
	if len(r.Ports) > 0 {
		if f.Proto != ProtoTCP && f.Proto != ProtoUDP {
			return false
		}
		ok := false
		for _, pr := range r.Ports {
			if pr.Contains(f.Port) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.Tokens) > 0 {
		ok := false
		for _, t := range r.Tokens {
			if t == f.Token {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// dstPrefix returns the most specific of r's prefixes that holds dst; with
// no prefixes every destination matches, as /0.
func (r *Rule) dstPrefix(dst netip.Addr) (netip.Prefix, bool) {
	if len(r.To) == 0 {
		return netip.PrefixFrom(netip.IPv6Unspecified(), 0), true
	}
	best, ok := netip.Prefix{}, false
	for _, pf := range r.To {
		if pf.Contains(dst) && (!ok || pf.Bits() > best.Bits()) {
			best, ok = pf, true
		}
	}
	return best, ok
}

// LogValue makes slog show Action as its String form in every log format
// (the JSON handler would otherwise print its fields).
func (a Action) LogValue() slog.Value { return slog.StringValue(a.String()) }
