// SPDX-License-Identifier: MIT

package topology

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// DebianRootCache is where DebianRoot keeps the roots it makes, between
// runs: making one takes minutes, using it seconds.
const DebianRootCache = "/var/cache/airlock-test"

// DebianRoot returns a minimal Debian root of the release suite (bookworm,
// trixie) with the packages include (comma-separated, may be empty), made
// by debootstrap from deb.debian.org the first time and kept under
// DebianRootCache/name/root. Callers must not change it: mount an overlay
// on it, or run read-only tools in it. Needs root and debootstrap (a
// failure under CI, else a skip).
func DebianRoot(t testing.TB, name, suite, include string) string {
	t.Helper()
	RequireRoot(t)
	dir := filepath.Join(DebianRootCache, name)
	root := filepath.Join(dir, "root")
	if _, err := os.Stat(filepath.Join(root, "etc", "debian_version")); err == nil {
		return root
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("debootstrap not installed (scripts/setup.sh test installs it): %v", err)
		}
		t.Skipf("debootstrap not installed (scripts/setup.sh test installs it): %v", err)
	}
	t.Logf("making a Debian %s root in %s (once; minutes)", suite, root)
	tmp := root + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"--variant=minbase"}
	if include != "" {
		args = append(args, "--include="+include)
	}
	args = append(args, suite, tmp, "http://deb.debian.org/debian")
	if out, err := exec.Command("debootstrap", args...).CombinedOutput(); err != nil {
		l := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(l) > 30 {
			l = l[len(l)-30:]
		}
		t.Fatalf("debootstrap %s: %v\n%s", strings.Join(args, " "), err, strings.Join(l, "\n"))
	}
	if err := os.Rename(tmp, root); err != nil {
		t.Fatal(err)
	}
	return root
}
