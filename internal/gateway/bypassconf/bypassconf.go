// SPDX-License-Identifier: MIT

// Package bypassconf is the gateway's half of site-local bypass: it turns
// the config's `[[bypass]]` entries, `[dns]` local domains and resolvers,
// and egress policy into the [control.Bypass] each job's lease carries.
// The client's half, which compiles that wire form and diverts flows, is
// internal/bypass; it imports nothing of the gateway's config.
package bypassconf

import (
	"slices"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// ForJob returns the bypass the gateway sends to a job that joined with
// token tok: the entries scoped to tok (or to every token), the local
// domains and resolvers, and pol's rules that apply to tok. It returns
// nil when b bypasses nothing.
func ForJob(b config.Bypass, pol *policy.Policy, tok string) *control.Bypass {
	if b.IsZero() {
		return nil
	}
	out := &control.Bypass{
		LocalDomains: slices.Clone(b.LocalDomains),
		Resolvers:    slices.Clone(b.Resolvers),
		Rules:        []control.Rule{},
		Policy:       control.Policy{Default: pol.Default.String()},
	}
	for _, r := range b.Rules {
		if appliesTo(r, tok) {
			out.Rules = append(out.Rules, encodeRule(r, false))
		}
	}
	for _, r := range pol.Rules {
		if appliesTo(r, tok) {
			out.Policy.Rules = append(out.Policy.Rules, encodeRule(r, true))
		}
	}
	return out
}

func appliesTo(r policy.Rule, tok string) bool {
	return len(r.Tokens) == 0 || slices.Contains(r.Tokens, tok)
}

func encodeRule(r policy.Rule, action bool) control.Rule {
	c := control.Rule{Name: r.Name, To: slices.Clone(r.To)}
	if action {
		c.Action = r.Action.String()
	}
	c.Proto = r.Proto
	for _, p := range r.Ports {
		c.Ports = append(c.Ports, [2]uint16{p.Lo, p.Hi})
	}
	return c
}
