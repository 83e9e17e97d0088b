// SPDX-License-Identifier: MIT

package airlock

import (
	"os"
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

	history, _ := filepath.Glob("docs/benchmarks/*.md")
	files := append(append([]string{"README.md", "CHANGELOG.md"}, docs...), history...)
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
