// SPDX-License-Identifier: MIT

package config

import (
	"fmt"
	"slices"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// Capture is one standing capture feed of a config ([[capture]]): the
// jobs' packets, selected, as a pcap stream to a file, named pipe or TAP
// device (package capture).
type Capture struct {
	// Name labels the feed's metrics and logs.
	Name string
	// To is an absolute path (file or named pipe) or tap:NAME.
	To string
	// Filter is the parsed filter (Filter.String() is the expression).
	Filter *capture.Filter
	// Tokens and Jobs select jobs (by token name; by batch job id, lease
	// id or tunnel address); both empty select every job.
	Tokens, Jobs []string
	// Rules are the policy rules whose destinations select packets
	// (Capture.RuleNames as written); empty selects every destination.
	Rules     []policy.Rule
	RuleNames []string
	// Snaplen and BufferBytes; 0 means the capture package's defaults.
	Snaplen, BufferBytes int
}

// Equal reports whether c and o describe the same feed.
func (c Capture) Equal(o Capture) bool {
	return c.Name == o.Name && c.To == o.To && c.Filter.String() == o.Filter.String() &&
		slices.Equal(c.Tokens, o.Tokens) && slices.Equal(c.Jobs, o.Jobs) && slices.Equal(c.RuleNames, o.RuleNames) &&
		c.Snaplen == o.Snaplen && c.BufferBytes == o.BufferBytes
}

type fileCapture struct {
	Name    string   `toml:"name"`
	To      string   `toml:"to"`
	Filter  string   `toml:"filter"`
	Tokens  []string `toml:"tokens"`
	Jobs    []string `toml:"jobs"`
	Rules   []string `toml:"rules"`
	Snaplen int64    `toml:"snaplen"`
	Buffer  string   `toml:"buffer"`
}

// validateCapture checks the [[capture]] tables; rules must name rules of
// pol.
func validateCapture(in []fileCapture, pol *policy.Policy, bad func(string, string, ...any)) []Capture {
	var out []Capture
	names := map[string]int{}
	for i, fc := range in {
		key := fmt.Sprintf("capture[%d]", i+1)
		c := Capture{Name: fc.Name, To: fc.To, Jobs: fc.Jobs, RuleNames: fc.Rules}
		if c.Name == "" {
			c.Name = fmt.Sprintf("capture%d", i+1)
		} else if err := policy.ValidateName(c.Name); err != nil {
			bad(key+".name", "%v", err)
		}
		if j, ok := names[c.Name]; ok {
			bad(key+".name", "%q is also the name of capture[%d]; names must be unique (they label metrics)", c.Name, j)
		}
		names[c.Name] = i + 1
		if c.To == "" {
			bad(key, "no to: want to = \"/path/of/file-or-named-pipe\" or \"tap:NAME\"")
		} else if err := capture.ValidateTo(c.To); err != nil {
			bad(key+".to", "%v", err)
		}
		f, err := capture.ParseFilter(fc.Filter)
		if err != nil {
			bad(key+".filter", "%v", err)
		}
		c.Filter = f
		c.Tokens = parseTokens(fc.Tokens, key+".tokens", bad)
		for _, j := range fc.Jobs {
			if j == "" || len(j) > 128 {
				bad(key+".jobs", "%q: want a batch job id, lease id or tunnel address of 1-128 characters", j)
			}
		}
		for _, name := range fc.Rules {
			k := slices.IndexFunc(pol.Rules, func(r policy.Rule) bool { return r.Name == name })
			if k < 0 {
				bad(key+".rules", "%q is not the name of a [[policy.rule]]", name)
				continue
			}
			c.Rules = append(c.Rules, pol.Rules[k])
		}
		c.Filter = c.Filter.WithRules(c.Rules)
		if fc.Snaplen < 0 || fc.Snaplen > capture.DefaultSnaplen {
			bad(key+".snaplen", "%d: want 1-%d (0: whole packets)", fc.Snaplen, capture.DefaultSnaplen)
		}
		c.Snaplen = int(fc.Snaplen)
		if fc.Buffer != "" {
			n, err := parseSize(fc.Buffer)
			if err != nil {
				bad(key+".buffer", "%v", err)
			}
			c.BufferBytes = n
		}
		out = append(out, c)
	}
	return out
}

// parseSize parses a byte count such as "4MiB", "512KiB", "1048576".
func parseSize(s string) (int, error) {
	var n int
	var unit string
	if _, err := fmt.Sscanf(s, "%d%s", &n, &unit); err != nil && unit == "" {
		if _, err := fmt.Sscanf(s, "%d", &n); err != nil {
			return 0, fmt.Errorf("%q: want a size such as 4MiB, 512KiB or 65536", s)
		}
	}
	mult := map[string]int{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("%q: unit %q: want B, KiB, MiB or GiB", s, unit)
	}
	if n < 1 || n > (1<<30)/mult {
		return 0, fmt.Errorf("%q: want 64KiB to 1GiB", s)
	}
	n *= mult
	if n < 64<<10 {
		return 0, fmt.Errorf("%q: want 64KiB to 1GiB", s)
	}
	return n, nil
}
