// SPDX-License-Identifier: MIT

package gateway

import (
	"testing"

	"github.com/airlock-vpn/airlock/internal/limits"
)

func TestJobLimits(t *testing.T) {
	l := limits.Job{EgressBitsPerSec: 100e6, MaxFlows: 5}
	all := LimitsConfig{Job: l}
	some := LimitsConfig{Job: l, Tokens: []string{"cms"}}
	for _, tt := range []struct {
		c    LimitsConfig
		tok  string
		want limits.Job
	}{
		{all, "cms", l},
		{all, "atlas", l},
		{some, "cms", l},
		{some, "atlas", limits.Job{}},
		{LimitsConfig{}, "cms", limits.Job{}},
	} {
		if got := tt.c.toConfig().ForToken(tt.tok); got != tt.want {
			t.Errorf("%+v, token %s: got %+v, want %+v", tt.c, tt.tok, got, tt.want)
		}
	}
}
