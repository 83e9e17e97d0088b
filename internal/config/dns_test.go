// SPDX-License-Identifier: MIT

package config

import (
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/limits"
)

func TestParseDNSLimits(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(`
version = 1
[limits.job]
dns_max_inflight = 16
dns_queries_per_sec = 20
[limits.token.crawler]
dns_queries_per_sec = 500.5
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Limits.ForToken("x"); got != (limits.Job{DNSMaxInflight: 16, DNSQueriesPerSec: 20}) {
		t.Errorf("job limits %+v", got)
	}
	if got := cfg.Limits.ForToken("crawler"); got != (limits.Job{DNSMaxInflight: 16, DNSQueriesPerSec: 500.5}) {
		t.Errorf("crawler limits %+v", got)
	}
	for _, tc := range []struct{ doc, want string }{
		{"version = 1\n[limits.job]\ndns_max_inflight = -1\n", "t.toml:3: limits.job.dns_max_inflight"},
		{"version = 1\n[limits.job]\ndns_queries_per_sec = \"unlimited\"\n", "t.toml:3: limits.job.dns_queries_per_sec"},
		{"version = 1\n[limits.token.a]\ndns_queries_per_sec = 2e6\n", "t.toml:3: limits.token.a.dns_queries_per_sec"},
	} {
		if _, err := Parse("t.toml", []byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.doc, err, tc.want)
		}
	}
}
