// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

const (
	promMetricsPort = 8446 // the gateway's metrics, in dmz
	promPort        = 9090 // Prometheus, in dmz
)

// promResult is the data of a Prometheus instant query.
type promResult struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// TestPrometheus scrapes the gateway with the distribution's Prometheus
// and queries the series through its HTTP API, loads the shipped alert
// rules into it and runs every query of the shipped Grafana dashboard.
func TestPrometheus(t *testing.T) {
	for _, b := range []string{"prometheus", "promtool"} {
		if _, err := os.Stat("/usr/bin/" + b); err != nil {
			t.Fatalf("%s not installed (scripts/setup.sh installs Debian's prometheus): %v", b, err)
		}
	}
	root, err := topology.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	alerts := filepath.Join(root, "docs", "prometheus", "alerts.yml")
	dashboard := filepath.Join(root, "docs", "grafana", "airlock.json")

	t.Run("PromtoolCheckRules", func(t *testing.T) {
		out, err := runCmd("promtool", "check", "rules", alerts)
		if err != nil || !strings.Contains(out, "SUCCESS: 10 rules found") {
			t.Errorf("promtool check rules %s: %v\n%s", alerts, err, out)
		}
	})

	// The gateway logs JSON, as a site shipping its logs would run it.
	e := newEnvMode(t, modeUser, "--metrics", fmt.Sprintf("127.0.0.1:%d", promMetricsPort), "--log-format", "json")
	dir := topology.TempDir(t)
	if err := os.Chown(dir, e.u.UID, e.u.GID); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "alerts.yml")
	data, err := os.ReadFile(alerts)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rules, data, 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: airlock
    static_configs:
      - targets: ["127.0.0.1:%d"]
`, rules, promMetricsPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := e.tp.Start(t, e.tp.DMZ, e.u, "prometheus", "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", promPort), "--log.level=warn")

	query := func(t *testing.T, q string) ([]promResult, error) {
		t.Helper()
		u := fmt.Sprintf("http://127.0.0.1:%d/api/v1/query?query=%s", promPort, url.QueryEscape(q))
		code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "curl", "-sS", "--max-time", "5", u)
		if code != 0 {
			return nil, fmt.Errorf("curl %s: exit %d %s", u, code, stderr)
		}
		var resp struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []promResult `json:"result"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			return nil, fmt.Errorf("query %q: %v: %q", q, err, out)
		}
		if resp.Status != "success" {
			return nil, fmt.Errorf("query %q: %s: %s", q, resp.Status, resp.Error)
		}
		return resp.Data.Result, nil
	}
	value := func(t *testing.T, q string) (float64, bool) {
		t.Helper()
		res, err := query(t, q)
		if err != nil || len(res) != 1 {
			return 0, false
		}
		s, _ := res[0].Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		return v, err == nil
	}

	// Traffic for the series: one job that stays, a 1 MiB download and a
	// connection the built-in policy denies (private range).
	holder := e.start(t, "sh", "-c", "echo ready; exec sleep 60")
	if code, out, stderr := e.run(t, "curl", "-sS", "--max-time", "30", "-o", "/dev/null", fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)); code != 0 {
		t.Fatalf("download: exit %d %s%s", code, out, e.diag(stderr))
	}
	if code, _, _ := e.run(t, "curl", "-sS", "--max-time", "5", "http://10.9.9.9:80/"); code == 0 {
		t.Errorf("curl to a private address succeeded; the built-in policy should deny it")
	}

	t.Run("Series", func(t *testing.T) {
		checks := []struct {
			q    string
			ok   func(float64) bool
			want string
		}{
			{`up{job="airlock"}`, func(v float64) bool { return v == 1 }, "1"},
			{`airlock_jobs`, func(v float64) bool { return v == 1 }, "1 (the holder job)"},
			{`airlock_bytes_total{direction="in"}`, func(v float64) bool { return v >= smallSize }, fmt.Sprintf(">= %d", smallSize)},
			{`airlock_bytes_total{direction="out"}`, func(v float64) bool { return v > 0 }, "> 0"},
			{`sum(airlock_policy_drops_total)`, func(v float64) bool { return v >= 1 }, ">= 1"},
			{`airlock_port_blocks_used`, func(v float64) bool { return v == 1 }, "1"},
		}
		deadline := time.Now().Add(30 * time.Second)
		for _, c := range checks {
			for {
				v, ok := value(t, c.q)
				if ok && c.ok(v) {
					break
				}
				if time.Now().After(deadline) {
					res, err := query(t, c.q)
					t.Errorf("Prometheus %s = %v (%v), want %s\n%s", c.q, res, err, c.want, prom.Describe())
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
		}
		// Labels as docs/metrics.md names them.
		res, err := query(t, `airlock_policy_drops_total`)
		if err != nil || len(res) == 0 || res[0].Metric["rule"] == "" {
			t.Errorf("airlock_policy_drops_total: %v %v, want a rule label", res, err)
		}
	})

	t.Run("AlertRulesLoaded", func(t *testing.T) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, out, _ := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "curl", "-sS", "--max-time", "5", fmt.Sprintf("http://127.0.0.1:%d/api/v1/rules", promPort))
			var resp struct {
				Data struct {
					Groups []struct {
						Rules []struct {
							Name           string `json:"name"`
							Health         string `json:"health"`
							LastError      string `json:"lastError"`
							LastEvaluation string `json:"lastEvaluation"`
						} `json:"rules"`
					} `json:"groups"`
				} `json:"data"`
			}
			healthy, n := 0, 0
			if code == 0 && json.Unmarshal([]byte(out), &resp) == nil {
				for _, g := range resp.Data.Groups {
					for _, r := range g.Rules {
						n++
						if r.Health == "ok" && r.LastError == "" {
							healthy++
						}
					}
				}
			}
			if n == 10 && healthy == 10 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("alert rules in Prometheus: %d of %d healthy, want 10 of 10:\n%s", healthy, n, out)
			}
			time.Sleep(250 * time.Millisecond)
		}
	})

	t.Run("DashboardQueries", func(t *testing.T) {
		b, err := os.ReadFile(dashboard)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", dashboard, err)
		}
		n := 0
		for _, p := range d.Panels {
			for _, tg := range p.Targets {
				n++
				// The gateway selector, as Grafana expands "All".
				res, err := query(t, strings.ReplaceAll(tg.Expr, "$instance", ".*"))
				if err != nil {
					t.Errorf("panel %q: %v", p.Title, err)
					continue
				}
				// Gauges the test's traffic set must have data (rates
				// may still lack two samples in their window).
				if strings.Contains(tg.Expr, "airlock_jobs") || strings.Contains(tg.Expr, "airlock_port_blocks") {
					if len(res) == 0 {
						t.Errorf("panel %q: %s returned no data", p.Title, tg.Expr)
					}
				}
			}
		}
		if n < 10 {
			t.Errorf("dashboard has %d queries, want at least 10", n)
		}
	})
	holder.Kill()

	t.Run("JSONLogs", func(t *testing.T) {
		checkJSONLines(t, "gateway", e.gw.Stderr(), 5)
		code, _, stderr := e.runWith(t, runOpts{flags: []string{"--log-format", "json", "--log-level", "info"}}, "true")
		if code != 0 {
			t.Fatalf("airlock run --log-format json: exit %d%s", code, e.diag(stderr))
		}
		checkJSONLines(t, "airlock run", stderr, 1)
	})
}

// checkJSONLines checks that every line of a --log-format json log is a
// JSON object with time, level and msg, except airlock run's one-line
// notices to the job's user ("airlock: ..."), and that there are at least
// min records.
func checkJSONLines(t *testing.T, who, log string, min int) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if strings.HasPrefix(line, "airlock: ") {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec["time"] == nil || rec["level"] == nil || rec["msg"] == nil {
			t.Errorf("%s --log-format json: line %q is not a JSON record with time, level and msg (%v)", who, line, err)
			continue
		}
		n++
	}
	if n < min {
		t.Errorf("%s --log-format json: %d records, want at least %d:\n%s", who, n, min, log)
	}
}
