// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// slurmEnv is the gateway env plus a one-node Slurm cluster in cn whose
// plugstack.conf loads Airlock's SPANK plugin, on by default in partition
// "airlock".
type slurmEnv struct {
	*env
	s       *topology.Slurm
	joinEnv []string // AIRLOCK_GATEWAY, _PIN, _TOKEN as NAME=VALUE
	// nodeMunge is the node's munged of the dedicated node+gateway MUNGE
	// key, gwMunge the gateway's (attested identity).
	nodeMunge, gwMunge *mungetest.Daemon
	// config is the gateway's config file (writeConfig).
	config string
	// plugStack is the cluster's plugstack.conf.
	plugStack string
}

// TestSlurm runs real Slurm jobs (sbatch, srun, job arrays, scancel, time
// limits, the SPANK opt-in) through the gateway, on one shared topology,
// gateway and cluster. The site uses attested identity as docs/security.md
// recommends: a dedicated MUNGE key for the nodes and the gateway, with a
// munged of its own on each side (besides the cluster's munged that Slurm
// uses), the gateway with --attest munge, and the SPANK plugin with
// attest=munge and a join settings file WITHOUT a token: the jobs that
// the plugin wraps join with MUNGE credentials alone. Jobs that run
// airlock run themselves use the token. The cluster uses
// proctrack/linuxproc; CgroupV2 starts a second one in cn, on the same
// gateway, with proctrack/cgroup and task/cgroup on cgroup v2.
func TestSlurm(t *testing.T) {
	// The cluster's own munged on MUNGE's default socket, with a key the
	// gateway does not have, as on every real node (issue 33, item 1):
	// no job may make its credential there.
	mungetest.StartDecoy(t)
	key := mungetest.NewKey(t)
	var nodeMunge, gwMunge *mungetest.Daemon
	gwConfig := filepath.Join(topology.TempDir(t), "gateway.toml")
	if err := os.WriteFile(gwConfig, []byte(slurmGatewayConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnvHook(t, modeUser, nil, func(e *env) []string {
		nodeMunge = mungetest.Start(t, mungetest.Options{Key: key, Origin: e.tp.CNAddr.String(), Wrap: inNetns(e.tp.CN)})
		gwMunge = mungetest.Start(t, mungetest.Options{Key: key, Wrap: inNetns(e.tp.DMZ)})
		return []string{"--attest", "munge", "--munge-socket", gwMunge.Socket, "--config", gwConfig}
	})
	plugin, wrapper := topology.BuildSpank(t)
	// The plugin's join settings: a root-only file with no token at all.
	joinFile := filepath.Join(topology.TempDir(t), "airlock-slurm.env")
	se := &slurmEnv{env: e, joinEnv: []string{"AIRLOCK_GATEWAY=" + e.gateway, "AIRLOCK_PIN=" + e.pin, "AIRLOCK_TOKEN=" + e.token},
		nodeMunge: nodeMunge, gwMunge: gwMunge, config: gwConfig}
	if err := os.WriteFile(joinFile, []byte("# written by TestSlurm\n"+strings.Join(se.joinEnv[:2], "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	se.plugStack = fmt.Sprintf("required %s airlock=%s wrapper=%s env=%s default=auto partitions=airlock attest=munge munge_socket=%s\n",
		plugin, e.airlock, wrapper, joinFile, nodeMunge.Socket)
	se.s = e.tp.StartSlurm(t, topology.SlurmOptions{
		User:       e.u,
		Partitions: []string{"airlock"},
		PlugStack:  se.plugStack,
	})

	// The time-limit job runs from the start, alongside the others:
	// Slurm checks limits every 30 s.
	timeLimitJob := se.startHolder(t, "timelimit", "--time=10")

	t.Run("DownloadExitCodes", se.testDownload)
	t.Run("Attribution", se.testAttribution)
	t.Run("Scancel", se.testScancel)
	t.Run("Array20", se.testArray)
	t.Run("SpankOptIn", se.testSpank)
	t.Run("TimeLimit", func(t *testing.T) { se.testTimeLimit(t, timeLimitJob) })
	t.Run("Attested", se.testAttested)
	t.Run("ClaimedJobID", se.testClaimedJobID)
	t.Run("ClaimsRoot", se.testClaimsRoot)
	t.Run("NoReusableSecret", se.testNoReusableSecret)
	t.Run("Replay", se.testReplay)
	t.Run("QuotaWait", se.testQuotaWait)
	t.Run("CgroupV2", se.testCgroupV2)   // a second cluster, on cgroup v2
	t.Run("BanSticks", se.testBanSticks) // last: the ban stays
}

// inNetns returns a mungetest wrapper that runs munged in network
// namespace ns (as the harness's daemons enter cn: nsenter --net).
func inNetns(ns string) func([]string) []string {
	return func(argv []string) []string {
		return append([]string{"nsenter", "--net=" + filepath.Join("/var/run/netns", ns), "--"}, argv...)
	}
}

// script writes a job script into the cluster's work directory.
func (se *slurmEnv) script(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(se.s.Work, name+".sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// sbatch submits script as the test user with the join settings in the
// environment, output to WORK/JOBID.out and .err.
func (se *slurmEnv) sbatch(t *testing.T, script string, args ...string) string {
	t.Helper()
	args = append([]string{"-o", filepath.Join(se.s.Work, "%j.out"), "-e", filepath.Join(se.s.Work, "%j.err")}, args...)
	return se.s.Sbatch(t, se.u, se.joinEnv, append(args, script)...)
}

func (se *slurmEnv) output(id string) string {
	out, _ := os.ReadFile(filepath.Join(se.s.Work, id+".out"))
	errb, _ := os.ReadFile(filepath.Join(se.s.Work, id+".err"))
	return string(out) + "\n--- stderr ---\n" + string(errb)
}

// fetchCmd downloads the small file by host name and prints its sha256.
func (se *slurmEnv) fetchCmd() string {
	return fmt.Sprintf("curl -sS --max-time 30 http://%s:%d/small | sha256sum", zoneName, se.httpPort)
}

func (se *slurmEnv) testDownload(t *testing.T) {
	ok := se.sbatch(t, se.script(t, "download", fmt.Sprintf("exec %s run -- sh -c 'set -e; %s'", se.airlock, se.fetchCmd())))
	fail := se.sbatch(t, se.script(t, "exit3", fmt.Sprintf("exec %s run -- sh -c 'exit 3'", se.airlock)))
	for _, tc := range []struct {
		id, state, exit string
	}{{ok, "COMPLETED", "0:0"}, {fail, "FAILED", "3:0"}} {
		a := se.s.WaitAccounting(t, tc.id, 60*time.Second)
		if a.State != tc.state || a.ExitCode != tc.exit || a.NodeList != topology.SlurmNode || a.User != fmt.Sprintf("%s(%d)", se.u.Name, se.u.UID) {
			t.Errorf("sacct job %s: %+v, want %s %s on %s by %s\n%s", tc.id, a, tc.state, tc.exit, topology.SlurmNode, se.u.Name, se.output(tc.id))
		}
	}
	if out := se.output(ok); !strings.HasPrefix(out, se.sha["small"]) {
		t.Errorf("job %s output %q, want the sha256 of the file %s%s", ok, out, se.sha["small"], se.diag(""))
	}
	// The flow log names the Slurm job.
	var log []byte
	if !topology.Poll(10*time.Second, func() bool {
		log, _ = os.ReadFile(filepath.Join(se.state, gatewayFlowLog))
		return strings.Contains(string(log), `"job_id":"`+ok+`"`)
	}) {
		t.Errorf("flow log has no flow of job %s:\n%s", ok, lastChars(string(log), 2000))
	}
}

// holder is a running Slurm job whose airlock run holds a lease.
type holder struct {
	id     string
	pid    int // the shell inside the namespace
	ready  time.Time
	status admin.JobStatus
}

// startHolder submits a job that runs a shell inside airlock run, which
// writes its PID and sleeps, and waits until its lease shows in status.
func (se *slurmEnv) startHolder(t *testing.T, name string, sbatchArgs ...string) holder {
	t.Helper()
	pidFile := filepath.Join(se.s.Work, name+".pid")
	id := se.sbatch(t, se.script(t, name, fmt.Sprintf("exec %s run -- sh -c 'echo $$ > %s; exec sleep 300'", se.airlock, pidFile)), sbatchArgs...)
	var h holder
	if !topology.PollEvery(60*time.Second, 100*time.Millisecond, func() bool {
		b, err := os.ReadFile(pidFile)
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || perr != nil {
			return false
		}
		for _, j := range se.status(t).Jobs {
			if j.JobID == id {
				h = holder{id: id, pid: pid, ready: time.Now(), status: j}
				return true
			}
		}
		return false
	}) {
		t.Fatalf("job %s: no PID file or no lease after 60 s (state %q)\n%s%s%s", id, se.s.State(t, id), se.output(id), se.diag(""), se.s.Logs())
	}
	return h
}

func (se *slurmEnv) testAttribution(t *testing.T) {
	h := se.startHolder(t, "attribution")
	defer se.s.Run(t, 10*time.Second, nil, "scancel", h.id)
	j := h.status
	if j.Host != topology.SlurmNode || j.User != se.u.Name {
		t.Errorf("status of job %s: host %q user %q, want Slurm's node %q and %q", h.id, j.Host, j.User, topology.SlurmNode, se.u.Name)
	}
	lo, _, ok := strings.Cut(j.Ports, "-")
	port, err := strconv.Atoi(lo)
	if !ok || err != nil {
		t.Fatalf("status of job %s: port block %q", h.id, j.Ports)
	}
	recs := se.whois(t, netip.AddrPortFrom(se.tp.DMZAddrINET, uint16(port)), time.Now())
	if len(recs) != 1 || recs[0].JobID != h.id || recs[0].BatchSystem != "slurm" || recs[0].Host != topology.SlurmNode || recs[0].User != se.u.Name {
		t.Errorf("whois %v:%d = %+v, want Slurm job %s of %s on %s", se.tp.DMZAddrINET, port, recs, h.id, se.u.Name, topology.SlurmNode)
	}
	// The plugin names the site's munged to every task (munge_socket=),
	// so a job that runs airlock run itself has its uid and node
	// attested too, and status says so.
	code, out, _ := se.admin(t, "status", "--state", se.state)
	attested := fmt.Sprintf("uid %d (munge) @ %s (munge)", se.u.UID, se.tp.CNAddr)
	if code != 0 || !strings.Contains(out, h.id) || !strings.Contains(out, attested) {
		t.Errorf("airlock status does not name job %s with %q:\n%s", h.id, attested, out)
	}
	if a := j.Attested; a == nil || a.UID != uint32(se.u.UID) || a.Node != se.tp.CNAddr {
		t.Errorf("status of job %s: attested %s, want uid %d on %s (airlock run with the socket the plugin names)", h.id, a, se.u.UID, se.tp.CNAddr)
	}
}

// leaseEnd waits up to 20 s for job id's lease to end and returns its
// history record.
func (se *slurmEnv) leaseEnd(t *testing.T, h holder) store.LeaseRecord {
	t.Helper()
	lo, _, _ := strings.Cut(h.status.Ports, "-")
	port, _ := strconv.Atoi(lo)
	var recs []store.LeaseRecord
	if !topology.PollEvery(20*time.Second, 200*time.Millisecond, func() bool {
		recs = se.whois(t, netip.AddrPortFrom(se.tp.DMZAddrINET, uint16(port)), h.ready)
		return len(recs) == 1 && !recs[0].End.IsZero()
	}) {
		t.Fatalf("job %s: lease not ended 20 s after the job: %+v%s", h.id, recs, se.diag(""))
	}
	return recs[0]
}

// checkEnded checks that the job's process inside the namespace is gone
// and that its lease was released (not left to expire) within 5 s of
// Slurm ending the job at jobEnd.
func (se *slurmEnv) checkEnded(t *testing.T, h holder, jobEnd time.Time) {
	t.Helper()
	if !topology.Poll(10*time.Second, func() bool { return syscall.Kill(h.pid, 0) != nil }) {
		t.Errorf("job %s: its process %d inside the namespace still runs 10 s after the job ended", h.id, h.pid)
	}
	rec := se.leaseEnd(t, h)
	if rec.EndReason != "released" {
		t.Errorf("job %s: lease ended %q, want released", h.id, rec.EndReason)
	}
	if d := rec.End.Sub(jobEnd); d > 5*time.Second {
		t.Errorf("job %s: lease ended %v after Slurm ended the job, want at once", h.id, d.Round(time.Millisecond))
	}
}

func (se *slurmEnv) testScancel(t *testing.T) {
	h := se.startHolder(t, "scancel")
	if syscall.Kill(h.pid, 0) != nil {
		t.Fatalf("job %s: process %d not running", h.id, h.pid)
	}
	start := time.Now()
	if code, out, stderr := se.s.Run(t, 10*time.Second, se.u, "scancel", h.id); code != 0 {
		t.Fatalf("scancel %s: exit %d %s %s", h.id, code, out, stderr)
	}
	se.checkEnded(t, h, start)
	if a := se.s.WaitAccounting(t, h.id, 30*time.Second); a.State != "CANCELLED" {
		t.Errorf("sacct job %s: %+v, want CANCELLED", h.id, a)
	}
	t.Logf("scancel to lease released: %v", time.Since(start).Round(time.Millisecond))
}

func (se *slurmEnv) testTimeLimit(t *testing.T, h holder) {
	// Slurm keeps limits in minutes; the controller's own time-limit
	// check ends a job whose end time has passed. Move the end time to
	// now rather than wait a minute.
	if code, out, stderr := se.s.Run(t, 10*time.Second, nil, "scontrol", "update", "JobId="+h.id, "EndTime=now"); code != 0 {
		t.Fatalf("scontrol update JobId=%s EndTime=now: exit %d %s %s", h.id, code, out, stderr)
	}
	a := se.s.WaitAccounting(t, h.id, 60*time.Second)
	if a.State != "TIMEOUT" {
		t.Errorf("sacct job %s: %+v, want TIMEOUT", h.id, a)
	}
	// sacct's End has a resolution of a second; the slurmctld log says
	// when the limit was enforced.
	se.checkEnded(t, h, time.Now().Add(-2*time.Second))
}

func (se *slurmEnv) testArray(t *testing.T) {
	const n = 20
	dir := filepath.Join(se.s.Work, "array")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	// Each task writes its tunnel address, waits (bounded) for the go
	// file, then downloads.
	body := fmt.Sprintf(`exec %s run -- sh -c 'ip -4 -o addr show tun0 > %[2]s/$SLURM_ARRAY_TASK_ID.addr; i=0; while [ ! -e %[2]s/go ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done; %[3]s'`,
		se.airlock, dir, se.fetchCmd())
	start := time.Now()
	id := se.sbatch(t, se.script(t, "array", body), fmt.Sprintf("--array=0-%d", n-1))
	var m []string
	if !topology.PollEvery(90*time.Second, 200*time.Millisecond, func() bool {
		m, _ = filepath.Glob(filepath.Join(dir, "*.addr"))
		return len(m) == n
	}) {
		_, q, _ := se.s.Run(t, 10*time.Second, nil, "squeue", "-h", "-o", "%i %T %R")
		t.Fatalf("array %s: %d of %d tasks up after 90 s; queue:\n%s%s", id, len(m), n, q, se.diag(""))
	}
	up := time.Since(start)
	// All 20 hold a lease at once, each with its own address and block.
	// Each task has a job id of its own (SLURM_JOB_ID), which the lease
	// carries.
	_, q, _ := se.s.Run(t, 10*time.Second, nil, "squeue", "-h", "-j", id, "-o", "%A")
	ids := map[string]bool{}
	for _, f := range strings.Fields(q) {
		ids[f] = true
	}
	st := se.status(t)
	addrs, blocks, jobs := map[netip.Addr]bool{}, map[string]bool{}, map[string]bool{}
	for _, j := range st.Jobs {
		if j.Host != topology.SlurmNode || !ids[j.JobID] {
			continue
		}
		jobs[j.JobID], addrs[j.Addr], blocks[j.Ports] = true, true, true
	}
	if len(jobs) != n || len(addrs) != n || len(blocks) != n {
		t.Errorf("array %s: %d jobs, %d addresses, %d port blocks at once, want %d each", id, len(jobs), len(addrs), len(blocks), n)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	se.s.WaitState(t, id, "", 90*time.Second)
	recs := se.s.Sacct(t)
	if len(ids) != n {
		t.Errorf("squeue -j %s: %d job ids, want %d", id, len(ids), n)
	}
	for task := range ids {
		a, ok := recs[task]
		if !ok || a.State != "COMPLETED" || a.ExitCode != "0:0" {
			t.Errorf("sacct of array task %s: %+v (found %v), want COMPLETED 0:0\n%s", task, a, ok, se.output(task))
		}
	}
	t.Logf("20 array tasks with a lease each after %v, all done after %v", up.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

func (se *slurmEnv) testSpank(t *testing.T) {
	// No airlock in the scripts: the plugin runs them through it.
	probe := se.script(t, "spank", "ip -o link show | awk -F': ' '{print $2}' | tr '\\n' ' '; echo; "+se.fetchCmd())
	noEnv := []string(nil) // the plugin's env= file supplies the join settings
	opt := se.s.Sbatch(t, se.u, noEnv, "-o", filepath.Join(se.s.Work, "%j.out"), "-e", filepath.Join(se.s.Work, "%j.err"), "--airlock", probe)
	def := se.s.Sbatch(t, se.u, noEnv, "-o", filepath.Join(se.s.Work, "%j.out"), "-e", filepath.Join(se.s.Work, "%j.err"), "-p", "airlock", probe)
	off := se.s.Sbatch(t, se.u, noEnv, "-o", filepath.Join(se.s.Work, "%j.out"), "-e", filepath.Join(se.s.Work, "%j.err"), "-p", "airlock", "--airlock=off", probe)
	plain := se.s.Sbatch(t, se.u, noEnv, "-o", filepath.Join(se.s.Work, "%j.out"), "-e", filepath.Join(se.s.Work, "%j.err"), probe)
	for _, tc := range []struct {
		name, id string
		inside   bool
	}{{"sbatch --airlock", opt, true}, {"sbatch -p airlock (partition default)", def, true}, {"sbatch -p airlock --airlock=off", off, false}, {"sbatch without --airlock", plain, false}} {
		a := se.s.WaitAccounting(t, tc.id, 60*time.Second)
		out := se.output(tc.id)
		links, _, _ := strings.Cut(out, "\n")
		// airlock run names its mode on stderr: netns (links lo and tun0)
		// or, when /dev/net/tun is not open to users, a fallback.
		mode := regexp.MustCompile(`(?m)^airlock: mode (\S+)`).FindStringSubmatch(out)
		if tc.inside {
			if a.State != "COMPLETED" || mode == nil || !strings.Contains(out, se.sha["small"]) ||
				(mode[1] == "netns" && strings.TrimSpace(links) != "lo tun0") {
				t.Errorf("%s (job %s): %+v, links %q, want COMPLETED through airlock run with the download\n%s", tc.name, tc.id, a, links, out)
			}
			continue
		}
		// Outside: cn's own links, and no route out.
		if mode != nil || !strings.Contains(links, "dmz0") || strings.Contains(out, se.sha["small"]) {
			t.Errorf("%s (job %s): links %q, want cn's own links, no airlock and no download\n%s", tc.name, tc.id, links, out)
		}
	}

	// srun, interactive: a step's task runs inside, exit status passes
	// through.
	code, out, stderr := se.s.Run(t, 60*time.Second, se.u, "srun", "--airlock", "-n1", "sh", "-c", se.fetchCmd())
	if code != 0 || !strings.HasPrefix(out, se.sha["small"]) {
		t.Errorf("srun --airlock: exit %d, %q, want the download's sha256\n%s%s", code, out, stderr, se.diag(""))
	}
	if code, out, stderr := se.s.Run(t, 60*time.Second, se.u, "srun", "--airlock", "-n1", "sh", "-c", "exit 3"); code != 3 {
		t.Errorf("srun --airlock sh -c 'exit 3': exit %d, want 3: %s %s", code, out, stderr)
	}
	if code, out, stderr := se.s.Run(t, 60*time.Second, se.u, "srun", "--airlock=bogus", "true"); code == 0 || !strings.Contains(stderr, "--airlock=bogus") {
		t.Errorf("srun --airlock=bogus: exit %d, %q %q, want a refusal naming it", code, out, stderr)
	}

	// salloc --airlock: the allocation's steps run inside.
	links := "ip -o link show | awk -F': ' '{print $2}' | tr '\\n' ' '"
	code, out, stderr = se.s.Run(t, 60*time.Second, se.u, "salloc", "--airlock", "srun", "sh", "-c", links)
	if code != 0 || !strings.Contains(stderr, "airlock: mode") || strings.Contains(out, "dmz0") {
		t.Errorf("salloc --airlock srun: exit %d, links %q, want the step inside airlock run\n%s", code, out, stderr)
	}
	// --airlock=steps: the batch script stays outside (its srun reaches
	// slurmd), the step it launches runs inside.
	steps := se.script(t, "steps", "echo \"batch: $("+links+")\"\nsrun sh -c \"echo step: \\$(ip -o link show | awk -F': ' '{print \\$2}' | tr '\\n' ' ')\"")
	id := se.s.Sbatch(t, se.u, noEnv, "-o", filepath.Join(se.s.Work, "%j.out"), "-e", filepath.Join(se.s.Work, "%j.err"), "--airlock=steps", steps)
	a := se.s.WaitAccounting(t, id, 60*time.Second)
	out = se.output(id)
	if a.State != "COMPLETED" || !regexp.MustCompile(`batch: lo dmz0`).MatchString(out) || !regexp.MustCompile(`airlock: mode`).MatchString(out) ||
		(strings.Contains(out, "airlock: mode netns") && !strings.Contains(out, "step: lo tun0")) {
		t.Errorf("sbatch --airlock=steps (job %s): %+v, want the script outside and its step inside\n%s", id, a, out)
	}
}

// lastChars returns the last n bytes of s, for failure messages.
func lastChars(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
