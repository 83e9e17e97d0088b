// SPDX-License-Identifier: MIT

package airlock

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdLink is a Markdown link's target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// anchor is GitHub's anchor of a Markdown heading.
func anchor(heading string) string {
	h := strings.ToLower(strings.TrimSpace(heading))
	h = regexp.MustCompile("[^a-z0-9 _-]").ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// anchors returns the heading anchors of a Markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if !inCode && strings.HasPrefix(l, "#") {
			out[anchor(strings.TrimLeft(l, "#"))] = true
		}
	}
	return out
}

// TestDocs keeps the documentation navigable: the README short and
// linking the index, the index listing every document, every relative
// link (and its #anchor) resolving, every alert pointing at a section of
// the troubleshooting guide.
func TestDocs(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 250 {
		t.Errorf("README.md has %d lines, want at most 250: move details into docs/ and link them", n)
	}
	if !strings.Contains(string(readme), "(docs/README.md)") {
		t.Error("README.md does not link docs/README.md, the index")
	}
	index, err := os.ReadFile("docs/README.md")
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := filepath.Glob("docs/*.md")
	for _, d := range docs {
		if name := filepath.Base(d); name != "README.md" && !strings.Contains(string(index), "("+name+")") {
			t.Errorf("docs/README.md does not list %s", name)
		}
	}

	files := append([]string{"README.md", "CHANGELOG.md"}, docs...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			full := f
			if path != "" {
				full = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(full); err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(full, ".md") && !anchors(t, full)[frag] {
				t.Errorf("%s: link %s: no heading #%s in %s", f, target, frag, full)
			}
		}
	}

	alerts, err := os.ReadFile("docs/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	guide := anchors(t, "docs/troubleshooting.md")
	nAlerts := strings.Count(string(alerts), "- alert:")
	runbooks := regexp.MustCompile(`runbook_url: "https://github.com/airlock-vpn/airlock/blob/main/docs/troubleshooting.md#([a-z0-9-]+)"`).FindAllStringSubmatch(string(alerts), -1)
	if len(runbooks) != nAlerts {
		t.Errorf("%d alerts, %d runbook_url annotations into docs/troubleshooting.md: want one each", nAlerts, len(runbooks))
	}
	for _, m := range runbooks {
		if !guide[m[1]] {
			t.Errorf("alerts.yml: runbook_url #%s is no heading of docs/troubleshooting.md", m[1])
		}
	}
}

// TestAlertRules checks the shipped alerts with the distribution's
// promtool, as a site loads them: `promtool check rules`, then the unit
// tests in docs/prometheus/alerts_test.yml (`promtool test rules`), and
// that every alert's runbook_url names a heading of
// docs/troubleshooting.md.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not installed (scripts/setup.sh installs Debian's prometheus): %v", err)
	}
	dir := filepath.Join("docs", "prometheus")
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	have := anchors(t, filepath.Join("docs", "troubleshooting.md"))
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(string(b), -1)
	runbooks := regexp.MustCompile(`runbook_url: "[^"#]*/docs/troubleshooting\.md#([^"]+)"`).FindAllStringSubmatch(string(b), -1)
	if len(alerts) == 0 || len(runbooks) != len(alerts) {
		t.Fatalf("%d alerts, %d runbook_urls into docs/troubleshooting.md: want one each", len(alerts), len(runbooks))
	}
	for i, rb := range runbooks {
		if !have[rb[1]] {
			t.Errorf("alert %s: runbook_url anchor #%s is no heading of docs/troubleshooting.md", alerts[i][1], rb[1])
		}
	}
}

// TestGrafanaDashboard checks docs/grafana/airlock.json as Grafana's file
// provisioning takes it (pkg/services/provisioning/dashboards): a JSON
// object with a title and a uid (provisioning matches dashboards by uid),
// no id (a provisioned dashboard must not carry a database id), and
// nothing of the import step: no __inputs or __requires, no ${DS_...}
// reference (provisioning does not substitute them, and every panel would
// say "data source not found"). Every data source reference must be the
// dashboard's own "datasource" variable, of type datasource for
// prometheus; panel ids must be unique. No Grafana can be installed from
// Debian's archive here, so this test does not load it into a running
// Grafana; TestPrometheus (test/e2e) runs every panel's query against a
// real Prometheus.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("docs", "grafana", "airlock.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("airlock.json is not a JSON object: %v", err)
	}
	for _, k := range []string{"title", "uid"} {
		if s, _ := d[k].(string); s == "" {
			t.Errorf("no %q: provisioning needs it", k)
		}
	}
	for _, k := range []string{"__inputs", "__requires", "id"} {
		if v, ok := d[k]; ok && v != nil {
			t.Errorf("%q present: an exported-for-import dashboard, not one to provision", k)
		}
	}
	if strings.Contains(string(b), "${DS_") {
		t.Error("a ${DS_...} reference: provisioning does not substitute it")
	}
	var dsVar bool
	tmpl, _ := d["templating"].(map[string]any)
	list, _ := tmpl["list"].([]any)
	for _, v := range list {
		m, _ := v.(map[string]any)
		if m["name"] == "datasource" && m["type"] == "datasource" && m["query"] == "prometheus" {
			dsVar = true
		}
	}
	if !dsVar {
		t.Error(`no templating variable {"name": "datasource", "type": "datasource", "query": "prometheus"}`)
	}
	// Every "datasource" value anywhere: the variable, as a string or as
	// {"type": "prometheus", "uid": "${datasource}"}.
	var walk func(path string, v any)
	refs := 0
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if k == "datasource" && path != "templating" {
					refs++
					switch ds := c.(type) {
					case string:
						if ds != "${datasource}" && ds != "$datasource" {
							t.Errorf("%s.datasource = %q, want the variable ${datasource}", path, ds)
						}
					case map[string]any:
						if ds["uid"] != "${datasource}" || ds["type"] != "prometheus" {
							t.Errorf("%s.datasource = %v, want {type: prometheus, uid: ${datasource}}", path, ds)
						}
					default:
						t.Errorf("%s.datasource = %v", path, c)
					}
					continue
				}
				walk(path+"."+k, c)
			}
		case []any:
			for i, c := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), c)
			}
		}
	}
	for k, v := range d {
		if k == "templating" {
			for i, tv := range list {
				if m, _ := tv.(map[string]any); m["type"] != "datasource" {
					walk(fmt.Sprintf("templating.list[%d]", i), tv)
				}
			}
			continue
		}
		walk(k, v)
	}
	if refs < 10 {
		t.Errorf("%d data source references, want one per panel and query variable", refs)
	}
	ids := map[float64]bool{}
	panels, _ := d["panels"].([]any)
	for i, p := range panels {
		m, _ := p.(map[string]any)
		id, _ := m["id"].(float64)
		if ids[id] {
			t.Errorf("panels[%d]: id %v used twice", i, id)
		}
		ids[id] = true
		if _, ok := m["gridPos"].(map[string]any); !ok {
			t.Errorf("panels[%d]: no gridPos", i)
		}
	}
}
