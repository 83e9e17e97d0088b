// SPDX-License-Identifier: MIT

// Package bypass is site-local bypass: destinations inside the site that
// the gateway's admin lists (`[[bypass]]`, `[dns] local_domains`) and that
// `airlock run` reaches from the compute node's own network, as the job's
// user, instead of through the gateway.
//
// # Theory of operation
//
// The gateway turns its config into one [control.Bypass] per job with
// bypassconf.ForJob (internal/gateway/bypassconf, the gateway's half):
// the entries of the job's token, the local domains and resolvers, and
// its egress policy as it applies to that token. It sends
// it in the lease and, after a reload, in the lease watch. The client
// compiles it ([Compile]) into a [Set] and hands it to its [Engine].
//
// A flow is bypassed only if it matches an entry (destination prefix,
// protocol, port) and the gateway's policy allows it: the client evaluates
// the very policy the gateway enforces (policy.Policy.Decide), so a
// denied destination is denied, not bypassed. Sending the policy rather
// than entries pre-intersected with it keeps one definition of a verdict
// (ordered allow/deny rules, port lists and the built-in protections do
// not intersect into prefixes), and the node's own addresses are
// protected with the node's address list, which only the client knows.
//
// In netns mode the [Device] decorates the job's TUN: packets from the job
// to a matching destination (TCP, UDP and ICMP echo), and DNS queries for local
// domains to the job's resolver address, are diverted into the client's
// own divert stack (stack.go: a gVisor netstack on the link endpoint both
// user-space stacks share, internal/stacklink; not the gateway's
// user-mode forwarder, which the node does not carry) that terminates them
// and re-originates them as host sockets through [Engine.Dial]; its DNS
// answers local names from the site resolvers. Nothing else is diverted:
// an answer for a local name that points outside the entries is carried
// through the gateway like any other destination, so DNS cannot widen the
// bypass. Echo requests are relayed through the node's ping sockets. In
// the fallback modes the
// client's dialer asks [Engine.Dial] first.
//
// [Engine.Dial] checks the entry and the policy again for every flow,
// dials an ordinary socket and counts the flow and its payload bytes per
// entry ([Counters]); the client reports the counters at each renewal.
package bypass

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Set is a compiled bypass: what the client matches flows against. It is
// immutable and safe for concurrent use.
type Set struct {
	// entries holds the bypass entries as allow rules with a default of
	// deny: Decide allows exactly the matching flows (and never the
	// floor: loopback, multicast, ...).
	entries *policy.Policy
	// gateway is the gateway's policy for the job.
	gateway *policy.Policy
	// prefixes are every entry's destinations, for a quick first test.
	prefixes  []netip.Prefix
	domains   []string
	resolvers []netip.AddrPort
	names     []string
}

// maxRules bounds the rules a Set takes from the gateway.
const maxRules = 1024

// Compile checks b, as sent by the gateway, and compiles it. A nil b
// gives an empty Set.
func Compile(b *control.Bypass) (*Set, error) {
	s := &Set{entries: &policy.Policy{Default: policy.Deny}, gateway: &policy.Policy{}}
	// The zero bypass is how the lease watch says "none".
	if b == nil || (len(b.Rules) == 0 && len(b.LocalDomains) == 0 && len(b.Resolvers) == 0 &&
		b.Policy.Default == "" && len(b.Policy.Rules) == 0) {
		return s, nil
	}
	if len(b.Rules) > maxRules || len(b.Policy.Rules) > maxRules || len(b.LocalDomains) > maxRules || len(b.Resolvers) > 16 {
		return nil, errors.New("bypass from the gateway: too many rules, domains or resolvers")
	}
	for _, cr := range b.Rules {
		r, err := decodeRule(cr, false)
		if err != nil {
			return nil, fmt.Errorf("bypass entry from the gateway: %w", err)
		}
		if len(r.To) == 0 {
			return nil, fmt.Errorf("bypass entry %q from the gateway has no destinations", r.Name)
		}
		s.entries.Rules = append(s.entries.Rules, r)
		s.prefixes = append(s.prefixes, r.To...)
		s.names = append(s.names, r.Name)
	}
	if err := s.entries.Validate(); err != nil {
		return nil, fmt.Errorf("bypass entries from the gateway: %w", err)
	}
	a, err := policy.ParseAction(b.Policy.Default)
	if err != nil {
		return nil, fmt.Errorf("policy from the gateway: default: %w", err)
	}
	s.gateway.Default = a
	for _, cr := range b.Policy.Rules {
		r, err := decodeRule(cr, true)
		if err != nil {
			return nil, fmt.Errorf("policy rule from the gateway: %w", err)
		}
		s.gateway.Rules = append(s.gateway.Rules, r)
	}
	if err := s.gateway.Validate(); err != nil {
		return nil, fmt.Errorf("policy from the gateway: %w", err)
	}
	for _, d := range b.LocalDomains {
		d = strings.ToLower(strings.TrimSuffix(d, "."))
		if d == "" || len(d) > 253 || strings.ContainsAny(d, " \t\r\n\\") {
			return nil, fmt.Errorf("local domain %q from the gateway: not a domain", d)
		}
		s.domains = append(s.domains, d)
	}
	for _, r := range b.Resolvers {
		if !r.IsValid() || r.Port() == 0 || r.Addr().IsUnspecified() || r.Addr().IsMulticast() {
			return nil, fmt.Errorf("site resolver %v from the gateway: not a resolver address", r)
		}
		s.resolvers = append(s.resolvers, netip.AddrPortFrom(r.Addr().Unmap(), r.Port()))
	}
	if len(s.domains) > 0 && len(s.resolvers) == 0 {
		return nil, errors.New("local domains from the gateway without a resolver")
	}
	return s, nil
}

func decodeRule(c control.Rule, action bool) (policy.Rule, error) {
	r := policy.Rule{Name: c.Name, Action: policy.Allow}
	if action {
		a, err := policy.ParseAction(c.Action)
		if err != nil {
			return r, fmt.Errorf("%q: %w", c.Name, err)
		}
		r.Action = a
	} else if c.Action != "" {
		return r, fmt.Errorf("%q: a bypass entry has no action", c.Name)
	}
	for _, p := range c.To {
		if !p.IsValid() {
			return r, fmt.Errorf("%q: bad prefix", c.Name)
		}
		r.To = append(r.To, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()))
	}
	r.Proto = c.Proto // validated as it was decoded
	for _, pr := range c.Ports {
		r.Ports = append(r.Ports, portblock.Range{Lo: pr[0], Hi: pr[1]})
	}
	return r, nil // Validate checks names, prefixes and ports
}

// IsEmpty reports whether s bypasses nothing.
func (s *Set) IsEmpty() bool { return s == nil || len(s.prefixes) == 0 && len(s.domains) == 0 }

// Rules returns the names of s's entries, in order.
func (s *Set) Rules() []string { return s.names }

// Resolvers returns the site resolvers.
func (s *Set) Resolvers() []netip.AddrPort {
	if s == nil {
		return nil
	}
	return s.resolvers
}

// Covers reports whether dst is in any entry's prefixes (whatever the
// protocol and port). It does not allocate.
func (s *Set) Covers(dst netip.Addr) bool {
	if s == nil {
		return false
	}
	for _, p := range s.prefixes {
		if p.Contains(dst) {
			return true
		}
	}
	return false
}

// Match returns the entry that bypasses a flow to dst (port: 0 for ICMP),
// if any. It does not check the gateway's policy (Allowed) and does not
// allocate.
func (s *Set) Match(proto policy.Proto, dst netip.Addr, port uint16) (string, bool) {
	if s == nil || !s.Covers(dst.Unmap()) {
		return "", false
	}
	v := s.entries.Decide(policy.Flow{Proto: proto, Dst: dst.Unmap(), Port: port})
	return v.Rule, v.Action == policy.Allow
}

// Allowed returns the gateway policy's verdict on a flow; host reports
// that dst is one of the node's own addresses.
func (s *Set) Allowed(proto policy.Proto, dst netip.Addr, port uint16, host bool) policy.Verdict {
	return s.gateway.Decide(policy.Flow{Proto: proto, Dst: dst.Unmap(), Port: port, Host: host})
}

// Policy returns the gateway's policy for the job.
func (s *Set) Policy() *policy.Policy { return s.gateway }

// HasLocal reports whether s names local domains (and so resolvers).
func (s *Set) HasLocal() bool { return s != nil && len(s.domains) > 0 }

// IsLocal reports whether name (a DNS name, with or without the final
// dot, any case) is in one of the local domains.
func (s *Set) IsLocal(name string) bool {
	if s == nil || len(s.domains) == 0 {
		return false
	}
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	for _, d := range s.domains {
		if n == d || strings.HasSuffix(n, "."+d) {
			return true
		}
	}
	return false
}
