// SPDX-License-Identifier: MIT

package topology

// A delegated cgroup v2 subtree for a slurmd, as systemd gives slurmd.service
// with Delegate=yes.
//
// Theory of operation: the harness makes a cgroup of its own at the root of
// the host's cgroup v2 hierarchy (wherever it is mounted: /sys/fs/cgroup on
// a unified host, /sys/fs/cgroup/unified on a hybrid one) and starts
// slurmd through enterCgroupScript: the script moves itself into that
// cgroup, makes a cgroup namespace there (so the subtree is all slurmd sees, and two
// clusters on one host cannot meet in one job_N cgroup) and a mount
// namespace where /sys/fs/cgroup is a cgroup2 mount of that subtree, then
// moves into /system.slice/slurmd.service, the path systemd would give it,
// and execs slurmd. Slurm (cgroup.conf: IgnoreSystemd=yes,
// CgroupAutomount=yes) enables the controllers the root offers down its
// subtree and creates system.slice/NODE_slurmstepd.scope/job_N/… there by
// itself, as it does under systemd with dbus.
//
// What this host allows (the test machine, a Firecracker VM, checked
// 2026-11): the v1 hierarchies of cpu, cpuset, memory, pids, io, devices
// and freezer are mounted (the VM's init keeps every command in a v1
// memory cgroup), so a controller bound there is not available in the v2
// hierarchy; the v2 root offers hugetlb only and enables none. So Slurm's
// cgroups here carry no controller (Slurm logs "Controller cpu is not
// enabled!" and goes on; cgroup.conf constrains devices only, with an
// eBPF program that needs no controller), but the tree and the
// cgroup.procs, cgroup.events and cgroup.freeze files that
// proctrack/cgroup uses are the kernel's real ones. And because v1
// hierarchies are in use, /proc/self/cgroup lists them before the "0::"
// line, which Slurm refuses as "Hybrid mode"; on such a host (hybrid),
// slurmd runs with testdata/cgroup2only.c preloaded, which hides the v1
// lines of that one file from Slurm's daemons and nothing else.
//
// Cleanup kills whatever is left in the subtree (cgroup.kill) and removes
// it, deepest first.

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// CgroupV2Mount returns where the host's cgroup v2 hierarchy is mounted
// (its root) in this mount namespace, and whether the host is hybrid:
// cgroup v1 hierarchies in use besides it, so that /proc/self/cgroup has
// lines other than "0::".
func CgroupV2Mount() (mount string, hybrid bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != "cgroup2" || fields[3] != "/" {
			continue
		}
		mount = fields[4]
		break
	}
	if err := sc.Err(); err != nil {
		return "", false, err
	}
	if mount == "" {
		return "", false, fmt.Errorf("no cgroup2 file system mounted (at its root) in /proc/self/mountinfo: mount one (mount -t cgroup2 none /sys/fs/cgroup/unified) or boot with systemd.unified_cgroup_hierarchy=1")
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		if !strings.HasPrefix(line, "0::") {
			hybrid = true
		}
	}
	return mount, hybrid, nil
}

// delegateCgroup makes a cgroup of its own at the root of the cgroup v2
// hierarchy, removed (its processes killed first) at t's cleanup. It
// returns the cgroup's directory and whether the host is hybrid (see
// CgroupV2Mount).
func delegateCgroup(t testing.TB) (dir string, hybrid bool) {
	t.Helper()
	RequireRoot(t)
	mount, hybrid, err := CgroupV2Mount()
	if err != nil {
		t.Fatalf("cgroup v2: %v", err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	dir = filepath.Join(mount, "airlock-test-"+hex.EncodeToString(rnd[:]))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("cgroup v2: cannot make a cgroup for slurmd (the harness needs a writable cgroup v2 hierarchy, as systemd's Delegate=yes gives slurmd.service): %v", err)
	}
	t.Cleanup(func() { removeCgroup(t, dir) })
	// No controller is enabled here: enterCgroupScript first puts its
	// own process into the cgroup, which a cgroup with controllers
	// enabled for its children refuses (EBUSY, "no internal processes").
	// slurmd (CgroupAutomount=yes) enables what the root offers once it
	// has moved on to its leaf.
	return dir, hybrid
}

// removeCgroup kills every process left in cgroup dir and its children
// (cgroup.kill), waits up to 10 s for it to empty and removes the cgroups,
// deepest first.
func removeCgroup(t testing.TB, dir string) {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0o644); err != nil && !os.IsNotExist(err) {
		t.Errorf("cgroup cleanup: kill %s: %v", dir, err)
	}
	if !Poll(10*time.Second, func() bool {
		ev, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		return err != nil || strings.Contains(string(ev), "populated 0")
	}) {
		t.Errorf("cgroup cleanup: %s still has processes 10 s after cgroup.kill", dir)
	}
	var dirs []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			t.Errorf("cgroup cleanup: %v", err)
		}
	}
}

// enterCgroupScript runs "$@" (as sh -c SCRIPT sh CGROUP ARGV...) in a new
// cgroup and mount namespace rooted at cgroup CGROUP, where
// /sys/fs/cgroup is that subtree's cgroup2 mount, from its
// /system.slice/slurmd.service.
const enterCgroupScript = `set -e
echo $$ > "$1/cgroup.procs"
shift
exec unshare --cgroup --mount --propagation slave -- sh -c '
set -e
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mkdir -p /sys/fs/cgroup/system.slice/slurmd.service
echo $$ > /sys/fs/cgroup/system.slice/slurmd.service/cgroup.procs
exec "$@"' sh "$@"`

// inCgroup rewrites cmd (started as root) to run in cgroup dir as
// enterCgroupScript describes, with preload (if not "") in LD_PRELOAD.
func inCgroup(cmd *exec.Cmd, dir, preload string) error {
	sh, err := exec.LookPath("sh")
	if err != nil {
		return err
	}
	cmd.Args = append([]string{"sh", "-c", enterCgroupScript, "sh", dir}, cmd.Args...)
	cmd.Path = sh
	if preload != "" {
		cmd.Env = append(cmd.Env, "LD_PRELOAD="+preload)
	}
	return nil
}

// cgroup2OnlyLib is the file name of testdata/cgroup2only.c built.
const cgroup2OnlyLib = "libcgroup2only.so"

// buildCgroup2Only builds testdata/cgroup2only.c with the C compiler once
// per process and returns the library's path.
func buildCgroup2Only(t testing.TB) string {
	t.Helper()
	return compileOnce(t, cgroup2OnlyLib, 0o644, func(out string) []string {
		return []string{"cc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-pedantic", "-Werror",
			"-o", out, filepath.Join("test", "topology", "testdata", "cgroup2only.c")}
	})
}
