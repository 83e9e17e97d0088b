// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
)

// The choice among several gateways, shared by airlock run's session and
// the load generator (test/loadgen), so that a measurement of many jobs
// over several gateways spreads and fails over as real jobs do.

// Gateway is one configured gateway: its control API address, as given,
// and a control client pinned to it.
type Gateway struct {
	Addr string
	CC   *control.Client
}

// ParseGateways splits the comma-separated gateway and pin lists (one pin
// per gateway in the same order, or one pin shared by all) and makes a
// control client for each, made with opts.
func ParseGateways(gateways, pins string, timeout time.Duration, opts ...control.ClientOption) ([]Gateway, error) {
	var addrs, ps []string
	for _, a := range strings.Split(gateways, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	for _, p := range strings.Split(pins, ",") {
		if p = strings.TrimSpace(p); p != "" {
			ps = append(ps, p)
		}
	}
	if len(addrs) == 0 {
		return nil, errors.New("no gateway: set --gateway or AIRLOCK_GATEWAY (from the admin's join.env)")
	}
	if len(addrs) == 1 && len(ps) > 1 {
		// One gateway, several pins: it may present any of them (a key
		// rotation, control/rotate.go).
		ps = []string{strings.Join(ps, "|")}
	}
	if len(ps) != 1 && len(ps) != len(addrs) {
		return nil, fmt.Errorf("%d pins for %d gateways: give one pin per gateway, in the same order, or one pin for all (--pin/AIRLOCK_PIN); a gateway whose key is being rotated takes both pins joined by |, e.g. sha256:NEW|sha256:OLD", len(ps), len(addrs))
	}
	seen := map[string]bool{}
	var out []Gateway
	for i, a := range addrs {
		if seen[a] {
			return nil, fmt.Errorf("gateway %s given twice", a)
		}
		seen[a] = true
		pin := ps[0]
		if len(ps) > 1 {
			pin = ps[i]
		}
		p, err := control.ParsePins(pin)
		if err != nil {
			return nil, fmt.Errorf("bad --pin/AIRLOCK_PIN for %s: %w", a, err)
		}
		cc, err := control.NewClient(a, strings.Join(p, "|"), timeout, opts...)
		if err != nil {
			return nil, err
		}
		out = append(out, Gateway{Addr: a, CC: cc})
	}
	return out, nil
}

// Ranked is a gateway, by its index in the list given to Rank, with its
// load report.
type Ranked struct {
	Index  int
	Health control.Health
}

// Rank asks every gateway of gws but the one at index skip (-1: none) for
// its load, in parallel and within healthTimeout, and orders them: fewest
// jobs first, then least traffic, then the order given. Unreachable and
// draining gateways are left out (and logged at info); a failover (skip
// >= 0) puts first a gateway drawn in proportion to free capacity
// (spread). Except when no
// gateway answered at all: then the ones that did not answer (but did not
// say they drain) are returned in a random order, with zero Health, for
// the caller to try, since a gateway too busy to report its load within
// healthTimeout (a join storm on every gateway) may still take a join;
// random, so that jobs that cannot compare loads still spread (in the
// order given they all went to the first; docs/benchmarks.md, "Several
// gateways").
// With one gateway and nothing skipped it asks nothing.
func Rank(ctx context.Context, log *slog.Logger, gws []Gateway, skip int) []Ranked {
	var rs []Ranked
	for i := range gws {
		if i != skip {
			rs = append(rs, Ranked{Index: i})
		}
	}
	if len(rs) <= 1 && skip < 0 {
		return rs // one gateway: no need to ask
	}
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i].Health, errs[i] = gws[rs[i].Index].CC.Health(ctx)
		}()
	}
	wg.Wait()
	var out, silent []Ranked
	for i, r := range rs {
		switch {
		case errs[i] != nil:
			log.Info("gateway not considered: no load report", "gateway", gws[r.Index].Addr, "err", errs[i])
			silent = append(silent, Ranked{Index: r.Index})
		case r.Health.Draining:
			log.Info("gateway not considered: draining", "gateway", gws[r.Index].Addr)
		default:
			out = append(out, r)
		}
	}
	if len(out) == 0 && len(silent) > 0 {
		log.Info("no gateway reported its load; trying them in a random order", "gateways", len(silent))
		rand.Shuffle(len(silent), func(i, j int) { silent[i], silent[j] = silent[j], silent[i] })
		return silent
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].Health, out[j].Health
		if a.Jobs != b.Jobs {
			return a.Jobs < b.Jobs
		}
		return a.RxBitsPerSec+a.TxBitsPerSec < b.RxBitsPerSec+b.TxBitsPerSec
	})
	if skip >= 0 {
		spread(out, rand.Float64())
	}
	return out
}

// spread moves to the front of rs (ordered least loaded first) one
// gateway drawn at random with a probability proportional to its free
// capacity (Health.Capacity - Health.Jobs), u uniform in [0, 1). Rank
// spreads a failover (skip >= 0): ordering alone sends every job that
// ranks at the same moment to the same gateway, and after a failover all
// the jobs of the lost gateway rank at once, see the same loads and would
// herd onto the least loaded one; drawn in proportion, they land on the
// others in proportion to their free capacity. A first join keeps the
// least loaded gateway. Without capacity reports (gateways older than
// this field) the order stays.
func spread(rs []Ranked, u float64) {
	total := 0
	for _, r := range rs {
		if r.Health.Capacity <= 0 {
			return
		}
		total += max(r.Health.Capacity-r.Health.Jobs, 0)
	}
	if total == 0 {
		return
	}
	x := int(u * float64(total))
	for i, r := range rs {
		x -= max(r.Health.Capacity-r.Health.Jobs, 0)
		if x < 0 {
			first := rs[i]
			copy(rs[1:i+1], rs[:i])
			rs[0] = first
			return
		}
	}
}
