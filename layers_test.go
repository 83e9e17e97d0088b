// SPDX-License-Identifier: MIT

package airlock

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The layer rules (issue 34 item 8, issue 35 item 3). Each rule names
// packages (roots) and what they may not reach: no root, and no package a
// root imports on the way, may import a forbidden package (or one under
// it). The walk stops at a forbidden package, so a violation is reported
// once, as the import that crosses the line. Paths are relative to the
// module; test files do not count (they are not linked into a binary).
type layerRule struct {
	name      string
	roots     []string
	forbidden []string
}

var layerRules = []layerRule{{
	// What runs on a compute node: airlock run, its namespace child and
	// preflight, linked into the node binary (go build -tags
	// airlock_node, which is also how this test lists cmd/airlock).
	name: "the node imports nothing of the gateway",
	roots: []string{"cmd/airlock", "internal/client", "internal/bypass", "internal/nsexec", "internal/tunnel",
		"internal/seccompnotify", "internal/fusemount", "internal/siteproxy", "internal/preflight",
		"internal/userstack", "internal/proxy", "internal/attest", "internal/munge", "internal/wgkey"},
	forbidden: []string{"internal/gateway", "internal/fleet", "internal/admin", "internal/config",
		"internal/forward", "internal/usernet", "internal/store", "internal/metrics", "internal/capture",
		"internal/flows", "internal/lease"},
}, {
	name:      "config does not import storage",
	roots:     []string{"internal/config"},
	forbidden: []string{"internal/store"},
}, {
	name:      "the wire protocol does not import storage",
	roots:     []string{"internal/control"},
	forbidden: []string{"internal/store"},
}, {
	name:      "storage imports no layer above it",
	roots:     []string{"internal/store"},
	forbidden: []string{"internal/control", "internal/config", "internal/gateway", "internal/fleet", "internal/admin", "internal/client"},
}}

// knownLayerViolations are the imports that break a rule today, each with
// the work that removes it. The test fails on a violation not listed here
// and on an entry that no longer occurs: remove it when its fix lands.
var knownLayerViolations = map[string]string{}

// TestLayers checks layerRules against the module's import graph (go
// list, with the node build's tag so that cmd/airlock is the node
// binary; no other package has build tags of its own).
func TestLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "airlock_node", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := parseImports(string(out))
	if len(imports["internal/client"]) == 0 {
		t.Fatalf("go list output has no internal/client imports:\n%.500s", out)
	}
	found := map[string]bool{}
	for _, r := range layerRules {
		for _, root := range r.roots {
			if _, ok := imports[root]; !ok {
				t.Errorf("rule %q: root %s is not a package of the module (update layerRules)", r.name, root)
			}
		}
		for _, v := range r.violations(imports) {
			found[r.name+": "+v] = true
		}
	}
	for v := range found {
		if _, ok := knownLayerViolations[v]; !ok {
			t.Errorf("new layer violation: %s", v)
		}
	}
	for v, why := range knownLayerViolations {
		if !found[v] {
			t.Errorf("known layer violation %q (%s) no longer occurs: remove it from knownLayerViolations", v, why)
		}
	}
}

// TestLayerRulesCatch checks that a rule reports an import that crosses
// it, also one reached through an allowed package, and once only.
func TestLayerRulesCatch(t *testing.T) {
	imports := parseImports("github.com/airlock-vpn/airlock/a github.com/airlock-vpn/airlock/b fmt\n" +
		"github.com/airlock-vpn/airlock/b github.com/airlock-vpn/airlock/x/y\n" +
		"github.com/airlock-vpn/airlock/x/y github.com/airlock-vpn/airlock/x\n" +
		"github.com/airlock-vpn/airlock/c github.com/airlock-vpn/airlock/x\n")
	got := layerRule{roots: []string{"a"}, forbidden: []string{"x"}}.violations(imports)
	if want := []string{"b -> x/y"}; !slices.Equal(got, want) {
		t.Errorf("violations = %q, want %q", got, want)
	}
	if got := (layerRule{roots: []string{"a"}, forbidden: []string{"c"}}).violations(imports); len(got) != 0 {
		t.Errorf("violations = %q, want none", got)
	}
}

// parseImports reads go list's "path import..." lines into the module's
// packages and their imports of the module, relative to the module.
func parseImports(out string) map[string][]string {
	const mod = "github.com/airlock-vpn/airlock/"
	m := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], mod) {
			continue
		}
		var in []string
		for _, p := range f[1:] {
			if strings.HasPrefix(p, mod) {
				in = append(in, strings.TrimPrefix(p, mod))
			}
		}
		m[strings.TrimPrefix(f[0], mod)] = in
	}
	return m
}

// under reports whether package p is one of dirs or under one.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// violations walks from r's roots through allowed packages and returns
// each import of a forbidden one, as "importer -> imported", sorted.
func (r layerRule) violations(imports map[string][]string) []string {
	var out []string
	seen := map[string]bool{}
	queue := slices.Clone(r.roots)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if seen[p] {
			continue
		}
		seen[p] = true
		for _, q := range imports[p] {
			if under(q, r.forbidden) {
				out = append(out, p+" -> "+q)
			} else {
				queue = append(queue, q)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
