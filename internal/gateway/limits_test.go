package gateway

import (
	"testing"

	"github.com/airlock-vpn/airlock/internal/forward"
)

func TestJobLimits(t *testing.T) {
	l := forward.Limits{EgressBitsPerSec: 100e6, MaxFlows: 5}
	all := LimitsConfig{Job: l}
	some := LimitsConfig{Job: l, Tokens: []string{"cms"}}
	for _, tt := range []struct {
		c    LimitsConfig
		tok  string
		want forward.Limits
	}{
		{all, "cms", l},
		{all, "atlas", l},
		{some, "cms", l},
		{some, "atlas", forward.Limits{}},
		{LimitsConfig{}, "cms", forward.Limits{}},
	} {
		if got := tt.c.toConfig().ForToken(tt.tok); got != tt.want {
			t.Errorf("%+v, token %s: got %+v, want %+v", tt.c, tt.tok, got, tt.want)
		}
	}
}
