// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/ipproto"
)

const bypassV1 = `version = 1
[[policy.rule]]
name = "site"
action = "allow"
to = ["10.20.0.0/16"]
[[policy.rule]]
name = "other-only"
action = "deny"
to = ["10.21.0.0/16"]
tokens = ["other"]
[[bypass]]
name = "squid"
to = ["10.20.0.5"]
proto = "tcp"
ports = [3128]
[[bypass]]
name = "other-storage"
to = ["10.21.0.0/16"]
tokens = ["other"]
[dns]
local_domains = ["site.test"]
resolvers = ["10.20.0.53"]
`

// TestGatewayBypass checks the gateway's side of site-local bypass: the
// lease carries the entries and policy of the job's token only, a reload
// reaches an open lease watch at once, and renewal reports are accounted
// for the entries of the job's token only.
func TestGatewayBypass(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gateway.toml")
	if err := os.WriteFile(file, []byte(bypassV1), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGatewayWith(t, func(c *Config) { c.ConfigFile = file })
	j := joinJob(t, g, newToken(t, g))
	b := j.lease.Bypass
	if b == nil || len(b.Rules) != 1 || b.Rules[0].Name != "squid" || b.Rules[0].Proto != ipproto.TCP ||
		len(b.LocalDomains) != 1 || len(b.Resolvers) != 1 || len(b.Policy.Rules) != 1 || b.Policy.Rules[0].Name != "site" {
		t.Fatalf("lease bypass %+v, want squid only and the site rule only (not token other's)", b)
	}
	ref := control.LeaseRef{ID: j.lease.ID, Secret: j.lease.Secret}
	ctx := context.Background()
	w, err := j.cc.Watch(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.First.Bypass == nil || len(w.First.Bypass.Rules) != 1 {
		t.Errorf("first watch event %+v, want the bypass", w.First)
	}

	// Counts for the job's entry are accounted; invented ones ignored.
	_, err = j.cc.RenewReport(ctx, control.RenewRequest{LeaseRef: ref, Bypass: []control.BypassCount{
		{Rule: "squid", Flows: 3, BytesOut: 10, BytesIn: 5000},
		{Rule: "other-storage", Flows: 1, BytesIn: 1},
		{Rule: "made-up", Flows: 1, BytesIn: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	st, err := adm.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Totals.Bypass) != 1 || st.Totals.Bypass[0].Rule != "squid" || st.Totals.Bypass[0].BytesIn != 5000 {
		t.Errorf("status bypass totals %+v, want squid with 5000 bytes in only", st.Totals.Bypass)
	}
	if len(st.Jobs) != 1 || len(st.Jobs[0].Bypass) != 1 || st.Jobs[0].Bypass[0].Flows != 3 {
		t.Errorf("job status %+v, want squid's 3 flows", st.Jobs)
	}

	// A reload without the entry reaches the watch at once.
	if err := os.WriteFile(file, []byte("version = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan control.WatchEvent, 1)
	go func() {
		for {
			ev, err := w.Next()
			if err != nil || ev.Bypass != nil {
				got <- ev
				return
			}
		}
	}()
	if _, err := adm.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-got:
		if ev.Bypass == nil || len(ev.Bypass.Rules) != 0 {
			t.Errorf("event after the reload %+v, want an empty bypass", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reload did not reach the watch within 5 s")
	}
}
