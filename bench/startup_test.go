// SPDX-License-Identifier: MIT

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// writeStartup writes startup.tsv into the run directory.
func writeStartup(t *testing.T, out string, startup []startupResult) {
	if len(startup) == 0 {
		return
	}
	var st strings.Builder
	st.WriteString("what\truns\tmedian_ms\tp95_ms\tnote\n")
	for _, r := range startup {
		fmt.Fprintf(&st, "%s\t%d\t%.1f\t%.1f\t%s\n", r.what, len(r.durs), ms(r.pct(50)), ms(r.pct(95)), strings.ReplaceAll(r.note, "\n", " "))
	}
	if err := os.WriteFile(filepath.Join(out, "startup.tsv"), []byte(st.String()), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("startup.tsv:\n%s", st.String())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// startupResult is one start-up measurement.
type startupResult struct {
	what string
	durs []time.Duration // sorted
	note string
}

func (r startupResult) pct(p int) time.Duration {
	if len(r.durs) == 0 {
		return 0
	}
	i := (len(r.durs)*p + 99) / 100
	if i > 0 {
		i--
	}
	return r.durs[i]
}

// benchStartup measures, runs times: for airlock, `airlock run -- true` as
// the test user in cn (join, namespace and TUN, WireGuard, exec, exit,
// release; includes ip netns exec and setpriv); for ocserv, from starting
// `vpnns` and `openconnect --no-dtls` to the first TCP connection from the
// namespace that reaches inet (teardown not included).
func benchStartup(t *testing.T, logs logDir, what string, runs int) startupResult {
	res := startupResult{what: what}
	tp := topology.New(t, topology.WithPrefix("bs"))
	u := topology.EnsureUser(t)
	switch what {
	case "airlock":
		res.what = "airlock run -- true"
		bin := topology.BuildAirlock(t)
		_, gateway, pin, token, err := airlockGateway(t, tp, logs, bin, "user")
		if err != nil {
			res.note = err.Error()
			return res
		}
		for i := 0; i < runs; i++ {
			t0 := time.Now()
			code, _, stderr := tp.Run(t, 60*time.Second, tp.CN, u, bin, "run", "--gateway", gateway, "--pin", pin, "--token", token, "--", "true")
			if code != 0 {
				res.note = fmt.Sprintf("exit %d: %.300s", code, stderr)
				res.durs = nil
				return res
			}
			res.durs = append(res.durs, time.Since(t0))
		}
	case "ocserv":
		res.what = "openconnect + vpnns to first connection"
		s, err := newOcserv(t, tp, logs, false, false)
		if err != nil {
			res.note = err.Error()
			return res
		}
		oc := s.(*ocservStack)
		failures := 0
		for i := 0; i < runs; i++ {
			home := filepath.Join(topology.TempDir(t), "home")
			if err := os.Mkdir(home, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(home, u.UID, u.GID); err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			c, err := connectOpenconnectFast(t, tp, logs, u, home, oc.srvAddr, oc.pin)
			d := time.Since(t0)
			if err != nil && failures < 5 {
				// vpnns -- sometimes loses the race with its own watcher
				// ("can't connect to watcher"); count it and try again.
				failures++
				res.note = fmt.Sprintf("%d failed attempts not counted; last: %.200s", failures, err)
				i--
				continue
			}
			if err != nil {
				res.note = err.Error()
				res.durs = nil
				return res
			}
			res.durs = append(res.durs, d)
			c.oc.kill()
			c.ns.kill()
		}
	}
	sort.Slice(res.durs, func(i, j int) bool { return res.durs[i] < res.durs[j] })
	t.Logf("%s: %d runs, median %.1f ms, p95 %.1f ms", res.what, len(res.durs), ms(res.pct(50)), ms(res.pct(95)))
	return res
}
