// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/limits"
)

// LimitsConfig are the traffic limits of the gateway's flags: the same
// per-job limits for every job (or only the jobs of the listed tokens) and
// a global cap per direction. The zero value limits nothing. A config file
// (Config.ConfigFile) sets limits per token instead; the two cannot be
// combined.
type LimitsConfig struct {
	// Job is applied to every job at join.
	Job limits.Job
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

// setBackend puts the policy and global limits of cfg in force in the
// egress backend, after checking the job limits no backend could enforce.
func setBackend(b forward.Backend, cfg *config.Config) error {
	if err := cfg.Limits.Job.Validate(); err != nil {
		return fmt.Errorf("job limits: %w", err)
	}
	if err := b.SetGlobalLimits(cfg.Limits.EgressBitsPerSec, cfg.Limits.IngressBitsPerSec); err != nil {
		return fmt.Errorf("set global limits: %w", err)
	}
	if err := b.SetPolicy(cfg.Policy); err != nil {
		return fmt.Errorf("set policy: %w", err)
	}
	return nil
}
