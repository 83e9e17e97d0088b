// SPDX-License-Identifier: MIT

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestSlurmPluginRefused runs a one-node cluster whose plugstack.conf
// names, as docs/slurm.md recommends for a first rollout, an optional
// plugin that this Slurm refuses to load: the plugin built for Slurm
// 23.11 (it needs spank_prepend_task_argv, which 22.05 lacks), as after a
// Slurm downgrade or a package built for another release. The node must
// stay up and run the partition's jobs, without Airlock, and the refusal
// must be in slurmd's log.
func TestSlurmPluginRefused(t *testing.T) {
	topology.RequireRoot(t)
	root, err := topology.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(topology.TempDir(t), "slurm")
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "slurm"), src).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	other := filepath.Join(src, "spank_airlock-2311.so")
	cc := exec.Command("cc", "-Itestdata/slurm-23.11", "-std=gnu11", "-O2", "-fPIC", "-shared", "-Wl,-z,now", "-o", other, "spank_airlock.c", "munge_job.c", "-ldl")
	cc.Dir = src
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("build the 23.11 plugin: %v\n%s", err, out)
	}
	if err := os.Chmod(filepath.Dir(src), 0o755); err != nil {
		t.Fatal(err)
	}
	tp := topology.New(t)
	u := topology.EnsureUser(t)
	s := tp.StartSlurm(t, topology.SlurmOptions{
		User:       u,
		Partitions: []string{"airlock"},
		PlugStack:  "optional " + other + " default=auto partitions=airlock\n",
	})
	script := filepath.Join(s.Work, "refused.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"airlock=${AIRLOCK_EGRESS_ADDR:-none}\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	id := s.Sbatch(t, u, nil, "-p", "airlock", "-o", filepath.Join(s.Work, "%j.out"), script)
	if acct := s.WaitAccounting(t, id, 60*time.Second); acct.State != "COMPLETED" {
		t.Errorf("job %s: %+v, want COMPLETED%s", id, acct, s.Logs())
	}
	out, _ := os.ReadFile(filepath.Join(s.Work, id+".out"))
	if !strings.Contains(string(out), "airlock=none") {
		t.Errorf("job output %q: want it run without Airlock (the plugin is not loaded)", out)
	}
	code, state, _ := s.Run(t, 30*time.Second, u, "sinfo", "-h", "-n", topology.SlurmNode, "-o", "%t")
	if code != 0 || strings.Contains(state, "drain") || strings.Contains(state, "down") {
		t.Errorf("node state %q (exit %d): want it up after the refused plugin%s", state, code, s.Logs())
	}
	logs, _ := os.ReadFile(filepath.Join(s.Dir, "log", "slurmd."+topology.SlurmNode+".log"))
	if !strings.Contains(string(logs), "spank_airlock-2311.so") {
		t.Errorf("slurmd's log does not name the refused plugin%s", s.Logs())
	}
	t.Logf("slurmd on the refused plugin: %s", grepLines(string(logs), "spank"))
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
