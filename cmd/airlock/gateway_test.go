// SPDX-License-Identifier: MIT

package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func TestParseEgress(t *testing.T) {
	for _, tt := range []struct {
		mode, addr, ports string
		block             int
		wantErr           string
		wantAddr          netip.Addr
		wantPorts         portblock.Range
	}{
		{mode: "user", block: 256},
		{mode: "kernel", addr: "203.0.113.1", ports: "20000-29999", block: 128,
			wantAddr: netip.MustParseAddr("203.0.113.1"), wantPorts: portblock.Range{Lo: 20000, Hi: 29999}},
		{mode: "fast", block: 256, wantErr: `bad --egress "fast"`},
		{mode: "kernel", addr: "gateway.example", block: 256, wantErr: "bad --egress-addr"},
		{mode: "kernel", ports: "30000", block: 256, wantErr: "bad --egress-ports"},
		{mode: "kernel", ports: "3-2", block: 256, wantErr: "bad --egress-ports"},
		{mode: "user", block: 0, wantErr: "bad --block-size"},
	} {
		cfg := gateway.Config{Egress: tt.mode, BlockSize: tt.block}
		err := parseEgress(&cfg, tt.addr, tt.ports)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%+v: got %v, want error with %q", tt, err, tt.wantErr)
			}
			continue
		}
		if err != nil || cfg.EgressAddr != tt.wantAddr || cfg.EgressPorts != tt.wantPorts {
			t.Errorf("%+v: got %v, %v, %v; want %v, %v", tt, err, cfg.EgressAddr, cfg.EgressPorts, tt.wantAddr, tt.wantPorts)
		}
	}
}

func TestLimitFlags(t *testing.T) {
	var c gateway.LimitsConfig
	f := limitFlags{jobEgress: "100mbit", jobIngress: "50Mbit", egress: "1gbit", tokens: "cms, atlas,"}
	if err := f.parse(&c); err != nil {
		t.Fatal(err)
	}
	if c.Job.EgressBitsPerSec != 100e6 || c.Job.IngressBitsPerSec != 50e6 || c.GlobalEgressBitsPerSec != 1e9 || c.GlobalIngressBitsPerSec != 0 {
		t.Errorf("rates: got %+v", c)
	}
	if strings.Join(c.Tokens, " ") != "cms atlas" {
		t.Errorf("tokens: got %q, want [cms atlas]", c.Tokens)
	}
	for _, tt := range []struct {
		f    limitFlags
		c    gateway.LimitsConfig
		want string
	}{
		{f: limitFlags{jobIngress: "fast"}, want: "--job-ingress-rate"},
		{f: limitFlags{ingress: "10 parsecs"}, want: "--ingress-rate"},
		{c: gateway.LimitsConfig{Job: limits.Job{MaxFlows: -2}}, want: "--job-max-flows"},
	} {
		if err := tt.f.parse(&tt.c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: got %v, want an error naming %s", tt.f, err, tt.want)
		}
	}
}
