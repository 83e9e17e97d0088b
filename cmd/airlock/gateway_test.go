package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/gateway"
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
