// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// testCgroupV2 runs a job through Airlock on a second cluster in cn, on
// the same gateway, whose node runs ProctrackType=proctrack/cgroup and
// TaskPlugin=task/cgroup on cgroup v2 (cgroup.conf CgroupPlugin=cgroup/v2),
// as most sites run Slurm (issue 34, item 3): slurmd in a cgroup v2
// subtree of its own mounted at /sys/fs/cgroup (test/topology/cgroup.go
// says what this host allows and what the harness does about it). The
// SPANK plugin wraps the job (partition airlock, attested identity). The
// job's shell, inside airlock run's user and network namespace, reads its
// own cgroup, leaves a process that ignores SIGTERM and SIGHUP in a
// session of its own, downloads through the gateway and sleeps; scancel
// must leave no process of the job and no job cgroup behind, and release
// the lease.
func (se *slurmEnv) testCgroupV2(t *testing.T) {
	s := se.tp.StartSlurm(t, topology.SlurmOptions{
		User:       se.u,
		Partitions: []string{"airlock"},
		PlugStack:  se.plugStack,
		CgroupV2:   true,
		FirstJobID: 1000000,
	})
	ce := *se
	ce.s = s
	dir := filepath.Join(s.Work, "cgroup")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`cat /proc/self/cgroup > %[1]s/cgroup
(echo x > %[3]s) 2> %[1]s/gpu
setsid sh -c 'trap "" HUP TERM; echo $$ > %[1]s/daemon.tmp; mv %[1]s/daemon.tmp %[1]s/daemon; exec sleep 300' </dev/null >/dev/null 2>&1 &
%[2]s > %[1]s/sha
echo $$ > %[1]s/pid
exec sleep 300`, dir, se.fetchCmd(), topology.SlurmGPU)
	id := ce.plugJob(t, ce.script(t, "cgroupv2", body))
	defer s.Run(t, 10*time.Second, nil, "scancel", id)
	j := ce.waitJob(t, id)
	readInt := func(name string) int {
		var n int
		topology.Poll(60*time.Second, func() bool {
			b, err := os.ReadFile(filepath.Join(dir, name))
			n, err = strconv.Atoi(strings.TrimSpace(string(b)))
			return err == nil
		})
		if n == 0 {
			t.Fatalf("job %s: no %s file after 60 s (state %q)\n%s%s", id, name, s.State(t, id), ce.output(id), s.Logs())
		}
		return n
	}
	pid, daemon := readInt("pid"), readInt("daemon")
	h := holder{id: id, pid: pid, ready: time.Now(), status: j}

	// Through the gateway.
	if sha, _ := os.ReadFile(filepath.Join(dir, "sha")); !strings.HasPrefix(string(sha), se.sha["small"]) {
		t.Errorf("job %s downloaded %q, want the sha256 of the file %s\n%s%s", id, sha, se.sha["small"], ce.output(id), se.diag(""))
	}
	if j.Host != topology.SlurmNode || j.User != se.u.Name || j.Attested == nil || j.Attested.Job == nil || j.Attested.Job.JobID != id {
		t.Errorf("status of job %s: host %q user %q attested %s, want Slurm's node, %s and the job id attested", id, j.Host, j.User, j.Attested, se.u.Name)
	}

	// The shell inside the namespace reads its own cgroup: the task's,
	// in the job's cgroup that Slurm made.
	self, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
	v2 := regexp.MustCompile(`(?m)^0::(/system\.slice/(?:[^/]+_)?slurmstepd\.scope/job_` + id + `)/step_batch/user/task_[^/\n]+$`).FindStringSubmatch(string(self))
	if v2 == nil {
		t.Fatalf("job %s: /proc/self/cgroup inside airlock run is\n%s\nwant 0::/system.slice/…slurmstepd.scope/job_%s/step_batch/user/task_…%s", id, self, id, s.Logs())
	}
	jobCgroup := filepath.Join(s.Cgroup, v2[1])
	inJob := cgroupProcs(jobCgroup)

	// Every process of the task (airlock run, its namespace child, the
	// job's shell, the process it left) is in the job's cgroup, and none
	// carries the harness's preload (test/topology/testdata).
	chain := userAncestors(pid, se.u.UID)
	if len(chain) < 2 {
		t.Fatalf("job %s: processes from the shell %d up to slurmstepd: %v, want at least airlock run and the shell", id, pid, chain)
	}
	run := chain[len(chain)-1]
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", run)); exe != se.airlock {
		t.Errorf("job %s: the task's process %d is %q, want airlock run (%s)", id, run, exe, se.airlock)
	}
	if netns(pid) == "" || netns(pid) == netns(run) {
		t.Errorf("job %s: the shell %d is in network namespace %q, airlock run %d in %q: want the shell in airlock's own", id, pid, netns(pid), run, netns(run))
	}
	procs := append(chain, daemon)
	for _, p := range procs {
		if !inJob[p] {
			cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p))
			t.Errorf("job %s: process %d (%s) is not in the job's cgroup %s but in\n%s", id, p, comm(p), jobCgroup, cg)
		}
		if env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p)); strings.Contains(string(env), "cgroup2only") {
			t.Errorf("job %s: process %d (%s) has the harness's preload in its environment", id, p, comm(p))
		}
	}

	// ConstrainDevices=yes: Slurm put its eBPF device filter on the job's
	// cgroup, which denies the node's GPU the job did not ask for, and
	// airlock run still opened its TUN under it (the shell is in a
	// network namespace of its own, checked above).
	sdLog, _ := os.ReadFile(filepath.Join(s.Dir, "log", "slurmd."+topology.SlurmNode+".log"))
	if !regexp.MustCompile(`EBPF Closing and loading bpf program into \S*/job_`+id+`\b`).Match(sdLog) ||
		regexp.MustCompile(`BPF (load error|attach)`).Match(sdLog) {
		t.Errorf("job %s: slurmd's log shows no device filter loaded into the job's cgroup, or an error loading it%s", id, s.Logs())
	}
	if gpu, _ := os.ReadFile(filepath.Join(dir, "gpu")); !strings.Contains(string(gpu), "Operation not permitted") {
		t.Errorf("job %s: writing to the GPU it was not given (%s) inside airlock run: %q, want Operation not permitted (the device filter)", id, topology.SlurmGPU, gpu)
	}

	start := time.Now()
	if code, out, stderr := s.Run(t, 10*time.Second, se.u, "scancel", id); code != 0 {
		t.Fatalf("scancel %s: exit %d %s %s", id, code, out, stderr)
	}
	ce.checkEnded(t, h, start)
	if !topology.Poll(10*time.Second, func() bool {
		for _, p := range procs {
			if syscall.Kill(p, 0) == nil {
				return false
			}
		}
		return true
	}) {
		for _, p := range procs {
			if syscall.Kill(p, 0) == nil {
				t.Errorf("job %s: process %d (%s) still runs 10 s after scancel", id, p, comm(p))
			}
		}
	}
	if !topology.Poll(10*time.Second, func() bool { _, err := os.Stat(jobCgroup); return os.IsNotExist(err) }) {
		t.Errorf("job %s: its cgroup %s is still there 10 s after scancel, with processes %v", id, jobCgroup, cgroupProcs(jobCgroup))
	}
	if a := s.WaitAccounting(t, id, 30*time.Second); a.State != "CANCELLED" {
		t.Errorf("sacct job %s: %+v, want CANCELLED", id, a)
	}
	t.Logf("job %s in %s: processes %v; scancel to all gone: %v", id, v2[1], procs, time.Since(start).Round(time.Millisecond))
}

// cgroupProcs returns the processes in cgroup dir and its descendants.
func cgroupProcs(dir string) map[int]bool {
	pids := map[int]bool{}
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil {
				pids[p] = true
			}
		}
		return nil
	})
	return pids
}

// userAncestors returns pid and its ancestors, nearest first, while their
// real uid (as the host sees it) is uid.
func userAncestors(pid, uid int) []int {
	var out []int
	for i := 0; pid > 1 && i < 32; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			break
		}
		var ppid, ruid int
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 {
					ruid, _ = strconv.Atoi(f[0])
				}
			}
		}
		if ruid != uid {
			break
		}
		out = append(out, pid)
		pid = ppid
	}
	return out
}

// netns returns the network namespace of pid ("" if gone).
func netns(pid int) string {
	ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	return ns
}

// comm returns pid's command name, for messages.
func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}
