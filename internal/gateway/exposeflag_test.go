// SPDX-License-Identifier: MIT

package gateway

import (
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/policy"
)

func TestParseExposePorts(t *testing.T) {
	for _, tt := range []struct {
		in      string
		allowed []string // proto/port pairs allowed
		denied  []string
		wantErr string
	}{
		{in: "", denied: []string{"tcp/8080", "udp/1"}},
		{in: "8080", allowed: []string{"tcp/8080", "udp/8080"}, denied: []string{"tcp/8081"}},
		{in: "8000-8999/tcp, 5000/udp", allowed: []string{"tcp/8000", "tcp/8999", "udp/5000"}, denied: []string{"udp/8000", "tcp/5000", "tcp/9000"}},
		{in: "8080/sctp", wantErr: "protocol"},
		{in: "0", wantErr: "PORT"},
		{in: "9-8", wantErr: "PORT"},
	} {
		ex, err := ParseExposePorts(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%q: got %v, want an error containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tt.in, err)
		}
		check := func(pp string) bool {
			proto, port, _ := strings.Cut(pp, "/")
			p, _ := policy.ParseProto(proto)
			var n uint16
			for _, c := range port {
				n = n*10 + uint16(c-'0')
			}
			return ex.Allowed("any-token", p, n)
		}
		for _, pp := range tt.allowed {
			if !check(pp) {
				t.Errorf("%q: %s denied, want allowed", tt.in, pp)
			}
		}
		for _, pp := range tt.denied {
			if check(pp) {
				t.Errorf("%q: %s allowed, want denied", tt.in, pp)
			}
		}
	}
}

// TestNoExposureByDefault: a gateway without a config file and without
// --expose-ports lets no job expose anything; --expose-ports and --config
// are exclusive.
func TestNoExposureByDefault(t *testing.T) {
	cfg, err := loadConfig(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Exposure.Allowed("t", policy.ProtoTCP, 8080) {
		t.Errorf("default config allows exposing tcp/8080; want no exposure without --expose-ports or an [[expose]] rule")
	}
	ex, _ := ParseExposePorts("8080")
	if _, err := loadConfig(Config{ConfigFile: "/nonexistent.toml", ExposePorts: ex}); err == nil || !strings.Contains(err.Error(), "cannot be combined") {
		t.Errorf("--config with --expose-ports: got %v, want a refusal", err)
	}
}
