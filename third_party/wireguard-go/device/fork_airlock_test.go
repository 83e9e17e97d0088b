/* SPDX-License-Identifier: MIT
 *
 * Airlock's patch: the fork stays the recorded upstream version plus
 * airlock.patch, so a reviewer reads the patch, not the package.
 */

package device

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestForkIsUpstreamPlusPatch applies ../airlock.patch to the device
// package of the wireguard-go version in go.mod (from the module cache), and
// ../airlock-conn.patch to its conn package, and fails when a result differs
// from this directory or ../conn in any file but Airlock's own tests
// (*_airlock_test.go): a change made here without remaking the patch, or a
// patch that no longer applies to the module's version, fails it. README.md
// beside the patches says how to remake them.
func TestForkIsUpstreamPlusPatch(t *testing.T) {
	if _, err := exec.LookPath("patch"); err != nil {
		t.Fatalf("the patch program is needed (Debian package patch; scripts/setup.sh installs it): %v", err)
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "golang.zx2c4.com/wireguard").Output()
	if err != nil {
		t.Fatalf("find upstream wireguard-go in the module cache: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	for _, pkg := range []struct{ name, dir, patch string }{
		{"device", ".", "../airlock.patch"},
		{"conn", "../conn", "../airlock-conn.patch"},
	} {
		t.Run(pkg.name, func(t *testing.T) {
			checkFork(t, filepath.Join(mod, pkg.name), pkg.dir, pkg.patch)
		})
	}
}

// checkFork applies patch to a copy of upstream's .go files and compares the
// result with dir.
func checkFork(t *testing.T, upstream, dir, patch string) {
	work := t.TempDir()
	ups, err := os.ReadDir(upstream)
	if err != nil {
		t.Fatalf("read upstream package: %v", err)
	}
	for _, e := range ups {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(upstream, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	patchFile, err := filepath.Abs(patch)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("patch", "-p1", "-s", "-f", "--no-backup-if-mismatch", "-r", "-", "-d", work, "-i", patchFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s does not apply to upstream %s: %v\n%s", patch, upstream, err, out)
	}
	want := goFiles(t, work, false)
	got := goFiles(t, dir, true)
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s: in upstream plus the patch, missing here", name)
		case !bytes.Equal(g, w):
			t.Errorf("%s: differs from upstream plus %s; remake the patch (README.md, Updating)", name, patch)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: here, but not in upstream plus %s; add it to the patch or name it *_airlock_test.go", name, patch)
		}
	}
}

// goFiles reads the .go files of dir by name, leaving out Airlock's own
// tests when skipOwnTests is set.
func goFiles(t *testing.T, dir string, skipOwnTests bool) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || (skipOwnTests && strings.HasSuffix(n, "_airlock_test.go")) {
			continue
		}
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	return files
}
