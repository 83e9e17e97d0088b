// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/syncbuf"
)

// TestConfigWarnings: a bypass entry the policy denies is logged at start,
// with the fix; a reload that adds the allow rule clears it, and one with
// a token name no token has reports that, in the log and to the admin.
func TestConfigWarnings(t *testing.T) {
	const denied = `version = 1
[[bypass]]
name = "squid"
to = ["10.20.0.5"]
proto = "tcp"
ports = [3128]
`
	file := filepath.Join(t.TempDir(), "gateway.toml")
	if err := os.WriteFile(file, []byte(denied), 0o600); err != nil {
		t.Fatal(err)
	}
	var log syncbuf.Buffer
	g := startGatewayWith(t, func(c *Config) {
		c.ConfigFile = file
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
	})
	if l := log.String(); !strings.Contains(l, `msg="config entry without effect"`) || !strings.Contains(l, `key=bypass[1]`) ||
		!strings.Contains(l, `bypass entry \"squid\" does nothing: the policy denies 10.20.0.5 tcp/3128 for every token (rule builtin-private)`) ||
		!strings.Contains(l, `to = [\"10.20.0.5/32\"]`) {
		t.Errorf("start-up log lacks the bypass warning with its fix:\n%s", l)
	}
	adm, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	fixed := denied + `[[policy.rule]]
name = "site"
action = "allow"
to = ["10.20.0.5/32"]
tokens = ["cms"]
`
	if err := os.WriteFile(file, []byte(fixed), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := adm.Reload(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], `policy.rule[1]: token "cms" does not exist`) {
		t.Errorf("reload warnings %q, want only the unknown token cms", res.Warnings)
	}
}
