package gateway

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/store"
)

// LimitsConfig are the gateway's traffic limits: the same per-job limits
// for every job (or only the jobs of the listed tokens) and a global cap per
// direction. The zero value limits nothing.
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

// jobLimits returns the limits of a job that joined with tok. It is the
// one place that decides a job's limits.
func (c LimitsConfig) jobLimits(tok store.Token) forward.Limits {
	if len(c.Tokens) > 0 && !slices.Contains(c.Tokens, tok.Name) {
		return forward.Limits{}
	}
	return c.Job
}

// setupLimits checks that the backend can enforce the configured limits
// and sets the global ones.
func setupLimits(c LimitsConfig, dev forward.Forwarder) (forward.Limiter, error) {
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
	if err := lim.SetGlobalLimits(c.GlobalEgressBitsPerSec, c.GlobalIngressBitsPerSec); err != nil {
		return nil, fmt.Errorf("set global limits: %w", err)
	}
	return lim, nil
}

// applyLimits sets the limits of the job at addr, which joined with tok.
// Jobs without limits are left alone.
func (g *gateway) applyLimits(addr netip.Addr, tok store.Token) (forward.Limits, error) {
	l := g.cfg.Limits.jobLimits(tok)
	if g.limiter == nil || l.IsZero() {
		return l, nil
	}
	if err := g.limiter.SetJobLimits(addr, l); err != nil {
		return l, fmt.Errorf("set limits of job %s: %w", addr, err)
	}
	return l, nil
}
