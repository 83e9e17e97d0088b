// SPDX-License-Identifier: MIT

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestSlurmPluginBuild builds the SPANK plugin as a site would for its
// Slurm major release: `make check-prepend` compiles the Slurm 23.11+ path
// (spank_prepend_task_argv) against the installed headers presented as
// 23.11 and checks that the installed release's build (22.05 on Debian 12)
// rewrites argv instead; scripts/dist-slurm.sh makes the
// airlock-slurm-MAJOR package, whose plugin path, dependency and Breaks
// tie it to that major. No Slurm 23.11 can be installed here, so the
// 23.11 path is compiled, not run.
func TestSlurmPluginBuild(t *testing.T) {
	root, err := topology.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(topology.TempDir(t), "slurm")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "slurm"), src).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	out, err := exec.Command("make", "-C", src, "check-prepend").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "check-prepend: ok") {
		t.Fatalf("make check-prepend: %v\n%s", err, out)
	}
	ver, err := exec.Command("make", "-s", "--no-print-directory", "-C", src, "slurm-version").Output()
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(strings.TrimSpace(string(ver)), ".")
	if len(parts) != 3 {
		t.Fatalf("slurm-version %q", ver)
	}
	major := parts[0] + "." + strings.Repeat("0", 2-len(parts[1])) + parts[1]

	dist := topology.TempDir(t)
	cmd := exec.Command(filepath.Join(root, "scripts", "dist-slurm.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "DIST="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/dist-slurm.sh: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "airlock-slurm-"+major+"_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("dist has %v, want one airlock-slurm-%s .deb", debs, major)
	}
	fields, err := exec.Command("dpkg-deb", "-f", debs[0], "Package", "Depends", "Breaks", "Provides", "Conflicts").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Package: airlock-slurm-" + major, "Depends: airlock (= ", "Breaks: slurmd (<< " + major + "), slurmd (>= ",
		"Provides: airlock-slurm", "Conflicts: airlock-slurm"} {
		if !strings.Contains(string(fields), want) {
			t.Errorf("package fields lack %q:\n%s", want, fields)
		}
	}
	files, err := exec.Command("dpkg-deb", "-c", debs[0]).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(files), "./usr/lib/airlock/slurm-"+major+"/spank_airlock.so") {
		t.Errorf("package lacks /usr/lib/airlock/slurm-%s/spank_airlock.so:\n%s", major, files)
	}
}
