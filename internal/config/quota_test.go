// SPDX-License-Identifier: MIT

package config

import (
	"strings"
	"testing"
)

func TestQuotas(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(`
version = 1
[quota.job]
max_leases = 100
[quota.token.pilots]
max_leases = 3
[quota.token.bulk]
joins_per_minute = 0
block_size = 1024
[quota.token.small]
block_size = 64
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tok  string
		want Quota
	}{
		{"other", Quota{MaxLeases: 100, JoinsPerMinute: DefaultJoinsPerMinute}},
		{"pilots", Quota{MaxLeases: 3, JoinsPerMinute: DefaultJoinsPerMinute}},
		{"bulk", Quota{MaxLeases: 100, JoinsPerMinute: 0, BlockSize: 1024}},
		{"small", Quota{MaxLeases: 100, JoinsPerMinute: DefaultJoinsPerMinute, BlockSize: 64}},
	} {
		if got := cfg.Quotas.ForToken(tc.tok); got != tc.want {
			t.Errorf("quota of %s: got %+v, want %+v", tc.tok, got, tc.want)
		}
	}
	if got, want := Default().Quotas.ForToken("x"), (Quota{JoinsPerMinute: DefaultJoinsPerMinute}); got != want {
		t.Errorf("default quota: got %+v, want %+v", got, want)
	}
	for doc, want := range map[string]string{
		"version = 1\n[quota.job]\nmax_leases = -1\n":          "quota.job.max_leases: -1",
		"version = 1\n[quota.token.\"a b\"]\nmax_leases = 1\n": `quota.token."a b"`,
		"version = 1\n[quota.job]\nmax_lease = 1\n":            "unknown key",
		"version = 1\n[quota.job]\nblock_size = 65536\n":       "quota.job.block_size: 65536",
		"version = 1\n[quota.job]\njoins_per_minute = \"x\"\n": "wrong type",
	} {
		if _, err := Parse("t.toml", []byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error containing %q", doc, err, want)
		}
	}
}
