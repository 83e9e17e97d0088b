// SPDX-License-Identifier: MIT

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/bearer/bearertest"
	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/preflight"
)

// TestBearerCheck: airlock run --check says where the job's bearer token
// was found, whose it is and until when; an expired one is a warning, an
// unreadable one a problem, none no line at all.
func TestBearerCheck(t *testing.T) {
	k := bearertest.NewEC("k")
	good := k.Sign(bearertest.Claims("https://iss.example", "alice", "gw", time.Hour, "compute.create"))
	old := k.Sign(bearertest.Claims("https://iss.example", "alice", "gw", -time.Hour, "compute.create"))
	for _, tt := range []struct {
		name   string
		env    map[string]string
		status preflight.Status
		want   string
	}{
		{"good", map[string]string{"BEARER_TOKEN": good}, preflight.OK, "from BEARER_TOKEN: issuer https://iss.example, subject alice"},
		{"expired", map[string]string{"BEARER_TOKEN": old}, preflight.Warn, "expired at"},
		{"unreadable", map[string]string{"BEARER_TOKEN_FILE": "/nonexistent/tok"}, preflight.Problem, "no such file"},
	} {
		cfg := client.Config{Getenv: func(k string) string { return tt.env[k] }}
		rs := bearerCheck(cfg)
		if len(rs) != 1 || rs[0].Status != tt.status || !strings.Contains(rs[0].Detail, tt.want) {
			t.Errorf("%s: got %+v, want status %v with %q", tt.name, rs, tt.status, tt.want)
		}
	}
	none := client.Config{Getenv: func(k string) string { return map[string]string{"XDG_RUNTIME_DIR": t.TempDir()}[k] }}
	if rs := bearerCheck(none); len(rs) != 0 && !strings.Contains(rs[0].Detail, "/tmp/bt_u") {
		t.Errorf("no token: got %+v, want no line", rs)
	}
}
