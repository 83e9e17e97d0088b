// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
)

// TestRank orders gateways by their load reports, leaves out draining and
// silent ones, and falls back to the silent ones in the order given when
// none answered.
func TestRank(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// serve answers health with h; a dead one refuses connections (as a
	// killed gateway does; one too busy to answer in time is the same to
	// Rank).
	serve := func(h control.Health, dead bool) Gateway {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewEncoder(w).Encode(h)
		}))
		t.Cleanup(srv.Close)
		if dead {
			srv.Listener.Close()
		}
		pin := control.Fingerprint(srv.Certificate())
		cc, err := control.NewClient(srv.Listener.Addr().String(), pin, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cc.Close)
		return Gateway{Addr: srv.Listener.Addr().String(), CC: cc}
	}
	busy := serve(control.Health{Jobs: 5}, false)
	idle := serve(control.Health{Jobs: 1}, false)
	draining := serve(control.Health{Jobs: 0, Draining: true}, false)
	silent := serve(control.Health{}, true)
	silent2 := serve(control.Health{}, true)
	idx := func(rs []Ranked) []int {
		var out []int
		for _, r := range rs {
			out = append(out, r.Index)
		}
		return out
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		gws  []Gateway
		skip int
		want []int
	}{
		{"least loaded first, draining and silent left out", []Gateway{busy, draining, idle, silent}, -1, []int{2, 0}},
		{"skip", []Gateway{busy, idle}, 1, []int{0}},
		{"one gateway: not asked", []Gateway{silent}, -1, []int{0}},
	} {
		if got := idx(Rank(ctx, log, tc.gws, tc.skip)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	// None answered: the silent ones, in a random order (both orders
	// within a bounded number of tries).
	seen := map[[2]int]bool{}
	for i := 0; i < 64 && len(seen) < 2; i++ {
		got := idx(Rank(ctx, log, []Gateway{silent2, draining, silent}, -1))
		if len(got) != 2 || (got[0]+got[1] != 2) || got[0] == got[1] {
			t.Fatalf("none answered: got %v, want 0 and 2 in some order", got)
		}
		seen[[2]int{got[0], got[1]}] = true
	}
	if len(seen) != 2 {
		t.Errorf("none answered: always the order %v in 64 tries, want both orders", seen)
	}
}

// TestSpread draws the first gateway in proportion to free capacity.
func TestSpread(t *testing.T) {
	mk := func(caps ...[2]int) []Ranked {
		var rs []Ranked
		for i, c := range caps {
			rs = append(rs, Ranked{Index: i, Health: control.Health{Capacity: c[0], Jobs: c[1]}})
		}
		return rs
	}
	// Free capacity 100 and 300: a quarter of the draws pick the first.
	counts := map[int]int{}
	const n = 1000
	for i := 0; i < n; i++ {
		rs := mk([2]int{200, 100}, [2]int{400, 100})
		spread(rs, (float64(i)+0.5)/n)
		counts[rs[0].Index]++
		if len(rs) != 2 || rs[0].Index == rs[1].Index {
			t.Fatalf("spread lost a gateway: %+v", rs)
		}
	}
	if counts[0] != 250 || counts[1] != 750 {
		t.Errorf("draws: got %v, want 250 and 750 of %d", counts, n)
	}
	// A full gateway is never first; without capacity reports the order
	// stays.
	for _, u := range []float64{0, 0.5, 0.999} {
		rs := mk([2]int{10, 10}, [2]int{10, 2})
		if spread(rs, u); rs[0].Index != 1 {
			t.Errorf("u=%v: full gateway first: %+v", u, rs)
		}
		rs = mk([2]int{0, 5}, [2]int{0, 1})
		if spread(rs, u); rs[0].Index != 0 {
			t.Errorf("u=%v: order changed without capacity reports: %+v", u, rs)
		}
	}
}
