// SPDX-License-Identifier: MIT

package config

import (
	"math"
	"sort"

	"github.com/airlock-vpn/airlock/internal/jointoken"
)

// Quota bounds what the jobs of one token may hold and do at the control
// API, so that one token cannot starve the others. Zero fields are
// unlimited.
type Quota struct {
	// MaxLeases is the most live leases (running jobs) at once.
	MaxLeases int
	// JoinsPerMinute is how many joins a minute, in bursts of as many.
	JoinsPerMinute int
	// BlockSize is how many egress ports a job gets when its join asks
	// for none (`airlock run --ports`); 0 means the gateway's
	// --block-size. The gateway's --max-block-size bounds it.
	BlockSize int
}

// DefaultJoinsPerMinute is [quota.job] joins_per_minute when not set.
const DefaultJoinsPerMinute = 6000

// Quotas are the per-token quotas of a config.
type Quotas struct {
	// Job is the quota of every token without an entry in Tokens.
	Job Quota
	// User is the quota of each attested uid's joins without a token
	// ([quota.user]; keys not set come from Job): at a site that needs
	// no token on its nodes, every user is metered on their own, so that
	// one user cannot hold the others' quota.
	User Quota
	// Tokens are the complete quotas of the tokens named.
	Tokens map[string]Quota
}

// ForToken returns the quota of the token named tok.
func (q Quotas) ForToken(tok string) Quota {
	if t, ok := q.Tokens[tok]; ok {
		return t
	}
	return q.Job
}

// DefaultQuotas are the quotas without a config file or [quota] section:
// no cap on leases (the gateway's tunnel addresses and port blocks bound
// them), DefaultJoinsPerMinute joins a minute per token.
func DefaultQuotas() Quotas {
	return Quotas{Job: Quota{JoinsPerMinute: DefaultJoinsPerMinute}, User: Quota{JoinsPerMinute: DefaultJoinsPerMinute}}
}

// fileQuotas is the [quota] section as written.
type fileQuotas struct {
	Job   fileQuota            `toml:"job"`
	User  fileQuota            `toml:"user"`
	Token map[string]fileQuota `toml:"token"`
}

type fileQuota struct {
	MaxLeases      *int64 `toml:"max_leases"`
	JoinsPerMinute *int64 `toml:"joins_per_minute"`
	BlockSize      *int64 `toml:"block_size"`
}

// resolve turns the [quota] section into Quotas on top of the defaults.
func (f fileQuotas) resolve(bad func(string, string, ...any)) Quotas {
	q := DefaultQuotas()
	q.Job = f.Job.resolve(q.Job, "quota.job", bad)
	q.User = f.User.resolve(q.Job, "quota.user", bad)
	if len(f.Token) == 0 {
		return q
	}
	q.Tokens = make(map[string]Quota, len(f.Token))
	toks := make([]string, 0, len(f.Token))
	for t := range f.Token {
		toks = append(toks, t)
	}
	sort.Strings(toks)
	for _, t := range toks {
		key := "quota.token." + quoteKey(t)
		if err := jointoken.ValidateName(t); err != nil {
			bad(key, "%v", err)
			continue
		}
		q.Tokens[t] = f.Token[t].resolve(q.Job, key, bad)
	}
	return q
}

func (f fileQuota) resolve(base Quota, key string, bad func(string, string, ...any)) Quota {
	out := base
	if f.MaxLeases != nil {
		if *f.MaxLeases < 0 || *f.MaxLeases > math.MaxInt32 {
			bad(key+".max_leases", "%d: want 0 (unlimited) to %d", *f.MaxLeases, math.MaxInt32)
		} else {
			out.MaxLeases = int(*f.MaxLeases)
		}
	}
	if f.JoinsPerMinute != nil {
		if *f.JoinsPerMinute < 0 || *f.JoinsPerMinute > 1e6 {
			bad(key+".joins_per_minute", "%d: want 0 (unlimited) to 1000000", *f.JoinsPerMinute)
		} else {
			out.JoinsPerMinute = int(*f.JoinsPerMinute)
		}
	}
	if f.BlockSize != nil {
		if *f.BlockSize < 0 || *f.BlockSize > 65535 {
			bad(key+".block_size", "%d: want 0 (the gateway's --block-size) to 65535 ports", *f.BlockSize)
		} else {
			out.BlockSize = int(*f.BlockSize)
		}
	}
	return out
}
