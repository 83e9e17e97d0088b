package gateway

import (
	"fmt"
	"net/netip"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/store"
)

// LimitsConfig are the traffic limits of the gateway's flags: the same
// per-job limits for every job (or only the jobs of the listed tokens) and
// a global cap per direction. The zero value limits nothing. A config file
// (Config.ConfigFile) sets limits per token instead; the two cannot be
// combined.
type LimitsConfig struct {
	// Job is applied to every job at join.
	Job forward.Limits
	// Tokens, if not empty, restricts Job to jobs that joined with a token
	// of one of these names; other jobs are unlimited.
	Tokens []string
	// GlobalEgressBitsPerSec and GlobalIngressBitsPerSec cap all jobs
	// together (0: unlimited).
	GlobalEgressBitsPerSec, GlobalIngressBitsPerSec uint64
}

// IsZero reports whether c limits nothing.
func (c LimitsConfig) IsZero() bool {
	return c.Job.IsZero() && c.GlobalEgressBitsPerSec == 0 && c.GlobalIngressBitsPerSec == 0
}

// setupLimits checks that the backend can enforce the configured limits
// and sets the global ones.
func setupLimits(c config.Limits, dev forward.Forwarder) (forward.Limiter, error) {
	if err := c.Job.Validate(); err != nil {
		return nil, fmt.Errorf("job limits: %w", err)
	}
	lim, ok := dev.(forward.Limiter)
	if !ok {
		if c.IsZero() {
			return nil, nil
		}
		return nil, fmt.Errorf("the egress backend cannot enforce rate or flow limits")
	}
	if err := lim.SetGlobalLimits(c.EgressBitsPerSec, c.IngressBitsPerSec); err != nil {
		return nil, fmt.Errorf("set global limits: %w", err)
	}
	return lim, nil
}

// applyLimits sets the limits of the job at addr, which joined with tok,
// from the config in force: the one place that decides a job's limits.
// Jobs without limits are left alone.
func (g *gateway) applyLimits(addr netip.Addr, tok store.Token) (forward.Limits, error) {
	l := g.conf.Load().Limits.ForToken(tok.Name)
	if g.limiter == nil || l.IsZero() {
		return l, nil
	}
	if err := g.limiter.SetJobLimits(addr, l); err != nil {
		return l, fmt.Errorf("set limits of job %s: %w", addr, err)
	}
	return l, nil
}
