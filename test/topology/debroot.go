// SPDX-License-Identifier: MIT

package topology

import (
	"fmt"
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
// by debootstrap from the host's own Debian mirror (HostDebianMirror) the
// first time and kept under
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
	mirror, err := HostDebianMirror()
	if err != nil {
		t.Fatal(err)
	}
	args = append(args, suite, tmp, mirror)
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

// HostDebianMirror returns the URI of the Debian archive this host's apt
// uses (the first of /etc/apt/sources.list.d/*.sources, then
// /etc/apt/sources.list, that is not the security archive): the mirror a
// site already reaches, its own if it has one.
func HostDebianMirror() (string, error) {
	var uris []string
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "URIs:"); ok {
				uris = append(uris, strings.Fields(v)...)
			}
		}
	}
	if b, err := os.ReadFile("/etc/apt/sources.list"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "deb" {
				u := f[1]
				if strings.HasPrefix(u, "[") { // deb [options] URI
					for i, x := range f {
						if strings.HasSuffix(x, "]") && i+1 < len(f) {
							u = f[i+1]
							break
						}
					}
				}
				uris = append(uris, u)
			}
		}
	}
	for _, u := range uris {
		if strings.HasPrefix(u, "http") && !strings.Contains(u, "security") {
			return strings.TrimSuffix(u, "/"), nil
		}
	}
	return "", fmt.Errorf("no Debian archive in this host's apt sources (/etc/apt/sources.list.d/*.sources, /etc/apt/sources.list): debootstrap needs the mirror the host uses")
}
