package forward

import (
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/policy"
)

// Policer is implemented by forwarders that enforce the site's egress
// policy (package policy) on jobs' new flows. Both backends enforce it
// identically: a denied TCP connection is reset at once (the job sees
// "connection refused"), denied UDP datagrams and ICMP echo requests are
// dropped; every denial is counted under the name of the rule that decided
// it.
//
// SetPolicy replaces the policy atomically; it applies to flows opened
// afterwards, flows already open are left alone. On error the old policy
// stays in force. Before the first SetPolicy a forwarder enforces the
// zero policy.Policy (allow all but the built-in protections).
//
// SetJobToken tells the forwarder the token name of a job AddJob added, for
// token-scoped rules; a job without one matches only rules without tokens.
// RemoveJob forgets it.
//
// PolicyDrops returns the cumulative number of denied flows (TCP
// connections, UDP datagrams, ICMP echo requests) per rule name: the
// policy's rule names and the built-in ones (policy.RuleFloor,
// policy.RuleHost, policy.RuleLinkLocal, policy.RulePrivate,
// policy.RuleInternal, policy.RuleMetadata,
// policy.RuleDefault). Counts never go down, also across SetPolicy calls;
// rules that never denied anything may be absent. This is the source of
// the "policy drops by rule" metric.
//
// All methods are safe for concurrent use.
type Policer interface {
	SetPolicy(p *policy.Policy) error
	SetJobToken(job netip.Addr, token string) error
	PolicyDrops() (map[string]uint64, error)
}
