// SPDX-License-Identifier: MIT

package gateway

import (
	"github.com/airlock-vpn/airlock/internal/config"
)

// warnConfig logs the entries of c that can never take effect (config
// warnings: shadowed rules, bypass entries the policy denies, token names
// no token has) and returns them as text.
func (g *gateway) warnConfig(c *config.Config) []string {
	var names []string
	if toks, err := g.st.Tokens(); err == nil {
		names = make([]string, 0, len(toks))
		for _, t := range toks {
			names = append(names, t.Name)
		}
	}
	ws := c.Warnings(names)
	out := make([]string, 0, len(ws))
	for _, w := range ws {
		g.log.Warn("config entry without effect", "file", w.File, "line", w.Line, "key", w.Key, "problem", w.Problem, "fix", w.Fix)
		out = append(out, w.String())
	}
	return out
}
