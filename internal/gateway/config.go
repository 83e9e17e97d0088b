// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"fmt"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// errNoConfigFile is returned by reload when the gateway runs without
// --config.
var errNoConfigFile = errors.New("this gateway runs without --config: there is no config file to reload; restart it with --config FILE")

// loadConfig returns the config the gateway starts with: the file of
// --config, validated completely, or one made from the limit flags. It
// runs before anything is opened.
func loadConfig(c Config) (*config.Config, error) {
	if c.ConfigFile == "" {
		cfg := config.Default()
		cfg.Limits = c.Limits.toConfig()
		// No exposure unless --expose-ports names it.
		cfg.Exposure = &policy.Exposure{}
		if c.ExposePorts != nil {
			cfg.Exposure = c.ExposePorts
		}
		cfg.Attest = c.Attest
		return cfg, nil
	}
	if c.ExposePorts != nil && len(c.ExposePorts.Rules) > 0 {
		return nil, fmt.Errorf("--config %s and --expose-ports cannot be combined: name the ports in the file's [[expose]] rules (docs/config.md)", c.ConfigFile)
	}
	if !c.Limits.IsZero() || len(c.Limits.Tokens) > 0 {
		return nil, fmt.Errorf("--config %s and the limit flags (--job-egress-rate, --job-ingress-rate, --egress-rate, --ingress-rate, --job-max-flows, --job-new-flows-per-sec, --job-dns-*, --job-limits-tokens) cannot be combined: set the limits in the file's [limits] section (docs/config.md)", c.ConfigFile)
	}
	cfg, err := config.Load(c.ConfigFile)
	if errors.Is(err, config.ErrAbsent) {
		return nil, fmt.Errorf("--config: %w; write one (see docs/gateway.example.toml) or leave out --config", err)
	}
	if err != nil {
		return nil, err
	}
	if !cfg.Attest.Set {
		cfg.Attest = c.Attest
	} else if c.Attest.Mode != "" {
		return nil, fmt.Errorf("--config %s has an [attest] table and --attest is given: set attested identity in one place (docs/config.md)", c.ConfigFile)
	}
	return cfg, nil
}

// toConfig turns the limit flags into config limits: the --job-* limits for
// every job, or only for the jobs of the --job-limits-tokens tokens.
func (c LimitsConfig) toConfig() config.Limits {
	l := config.Limits{EgressBitsPerSec: c.GlobalEgressBitsPerSec, IngressBitsPerSec: c.GlobalIngressBitsPerSec}
	if len(c.Tokens) == 0 {
		l.Job = c.Job
		return l
	}
	l.Tokens = make(map[string]limits.Job, len(c.Tokens))
	for _, t := range c.Tokens {
		l.Tokens[t] = c.Job
	}
	return l
}

// reload loads the config file again and puts it in force: the policy
// for new flows, the global limits, and every running job's limits. On any
// error the old config stays in force (a policy the backend took is put
// back) and the error, naming file, line and key, is returned and logged.
func (ag *adminGateway) reload() (admin.ReloadResult, error) {
	ag.reloadMu.Lock()
	defer ag.reloadMu.Unlock()
	if ag.g.cfg.Reloading != nil {
		defer ag.g.cfg.Reloading()()
	}
	res, err := ag.reloadLocked()
	if err != nil {
		ag.g.log.Error("config reload failed; the old config stays in force", "file", ag.g.cfg.ConfigFile, "err", err)
		return res, err
	}
	ag.g.log.Info("config reloaded", "file", res.File, "rules", res.Rules, "default", res.Default,
		"token_limits", res.TokenLimits, "jobs_relimited", res.Jobs, "expose_rules", res.ExposeRules,
		"bypass", ag.g.conf.Load().Bypass.String())
	return res, nil
}

func (ag *adminGateway) reloadLocked() (admin.ReloadResult, error) {
	if ag.g.cfg.ConfigFile == "" {
		return admin.ReloadResult{}, errNoConfigFile
	}
	cfg, err := config.Load(ag.g.cfg.ConfigFile)
	if err != nil {
		return admin.ReloadResult{}, err
	}
	old := ag.g.conf.Load()
	if err := ag.g.backend.SetPolicy(cfg.Policy); err != nil {
		return admin.ReloadResult{}, fmt.Errorf("apply the new policy: %w", err)
	}
	res := admin.ReloadResult{File: cfg.Path, Rules: len(cfg.Policy.Rules), Default: cfg.Policy.Default.String(),
		TokenLimits: len(cfg.Limits.Tokens), ExposeRules: len(cfg.Exposure.Rules)}
	if err := ag.g.backend.SetGlobalLimits(cfg.Limits.EgressBitsPerSec, cfg.Limits.IngressBitsPerSec); err != nil {
		_ = ag.g.backend.SetPolicy(old.Policy)
		return admin.ReloadResult{}, fmt.Errorf("apply the new global limits: %w", err)
	}
	if !cfg.Attest.Set {
		cfg.Attest = ag.g.cfg.Attest
	}
	if err := ag.g.admit.applyAttest(cfg.Attest); err != nil {
		_ = ag.g.backend.SetPolicy(old.Policy)
		_ = ag.g.backend.SetGlobalLimits(old.Limits.EgressBitsPerSec, old.Limits.IngressBitsPerSec)
		return admin.ReloadResult{}, err
	}
	if err := ag.g.admit.applyBearer(cfg.Bearer); err != nil {
		_ = ag.g.backend.SetPolicy(old.Policy)
		_ = ag.g.backend.SetGlobalLimits(old.Limits.EgressBitsPerSec, old.Limits.IngressBitsPerSec)
		_ = ag.g.admit.applyAttest(old.Attest)
		return admin.ReloadResult{}, err
	}
	ag.g.conf.Store(cfg)
	res.Warnings = ag.g.warnConfig(cfg)
	ag.g.admit.warnBlockSizes(cfg.Quotas)
	ag.g.bypassNotice.changed()
	ag.g.setFeeds(ag.g.feedsOf(cfg))
	for _, l := range ag.g.leases.Leases() {
		o := l.Owner
		lim := cfg.Limits.ForToken(o.Token)
		if lim == old.Limits.ForToken(o.Token) {
			continue
		}
		if err := ag.g.backend.SetJobLimits(jobs.ID(l.ID), lim); err != nil && !errors.Is(err, forward.ErrUnknownJob) {
			ag.g.log.Error("reload: cannot set a running job's new limits; it keeps its old ones", "lease", l.ID, "addrs", l.Addrs, "err", err)
			continue
		}
		res.Jobs++
	}
	return res, nil
}

// reloadLoop reloads on every value from c (SIGHUP) until ctx ends.
func (ag *adminGateway) reloadLoop(ctx context.Context, c <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c:
			if ag.g.cfg.ConfigFile == "" {
				ag.g.log.Warn("SIGHUP ignored: this gateway runs without --config, there is nothing to reload")
				continue
			}
			_, _ = ag.reload()
		}
	}
}

// exposureAllowed checks a join's --expose request against the config:
// every port must be allowed for the job's token.
func (a *admission) exposureAllowed(token string, reqs []forward.Exposure) error {
	ex := a.g.conf.Load().Exposure
	for _, x := range reqs {
		if !ex.Allowed(token, x.Proto, x.JobPort) {
			return fmt.Errorf("%w %d/%s: the gateway's config does not allow jobs of token %q to expose it; ask the gateway's admin for an [[expose]] rule (docs/config.md)",
				errNoExposure, x.JobPort, x.Proto, token)
		}
	}
	return nil
}
