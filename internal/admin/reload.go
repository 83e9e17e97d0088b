// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"fmt"
	"net/http"
)

// ReloadPath is the admin endpoint that reloads the gateway's config file:
// POST, no body; the answer is a [ReloadResult], or an error whose message
// names the file, line and key of the problem (the old config stays).
const ReloadPath = "/v1/reload"

// CodeBadConfig is the error code of a reload whose file is invalid or
// cannot be applied.
const CodeBadConfig = "bad_config"

// ReloadResult describes the config a reload put in force.
type ReloadResult struct {
	// File is the config file's path.
	File string `json:"file"`
	// Rules is the number of policy rules; Default the default verdict.
	Rules   int    `json:"rules"`
	Default string `json:"default"`
	// TokenLimits is the number of tokens with limits of their own;
	// Jobs the number of running jobs whose limits were re-applied.
	TokenLimits int `json:"token_limits"`
	Jobs        int `json:"jobs"`
	// ExposeRules is the number of [[expose]] rules.
	ExposeRules int `json:"expose_rules"`
	// Warnings are the file's entries that can never take effect, each
	// with its fix (config.Warning).
	Warnings []string `json:"warnings,omitempty"`
}

// Reload asks the gateway to reload its config file (like SIGHUP) and
// waits for the outcome.
func (c *Client) Reload(ctx context.Context) (ReloadResult, error) {
	var res ReloadResult
	if err := c.do(ctx, http.MethodPost, ReloadPath, nil, &res); err != nil {
		return ReloadResult{}, fmt.Errorf("reload: %w", err)
	}
	return res, nil
}
