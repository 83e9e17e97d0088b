// SPDX-License-Identifier: MIT

package topology

// A one-node Slurm cluster inside a topology, from the distribution's
// packages (slurmctld, slurmd, slurm-client, munge).
//
// Theory of operation: StartSlurm writes a slurm.conf, a munge key and a
// plugstack.conf into a new directory and starts munged, slurmctld and
// slurmd in the foreground, each in its own process group, in cn's network
// namespace. They enter it with nsenter --net, not ip netns exec: the
// latter remounts /sys for the namespace, which hides /sys/fs/cgroup, and
// slurmd refuses to start without a cgroup file system even when no cgroup
// plugin is configured. Controller and node talk over cn's address (Slurm
// resolves addresses with AI_ADDRCONFIG, which a namespace with only
// loopback fails). The node is declared with more CPUs than the machine
// has (SlurmdParameters=config_overrides) so that job arrays run at once;
// by default nothing needs cgroups: ProctrackType=proctrack/linuxproc (a
// job's processes are slurmstepd's descendants), TaskPlugin=task/none,
// JobAcctGatherType=jobacct_gather/none. With SlurmOptions.CgroupV2,
// proctrack/cgroup and task/cgroup run on a cgroup v2 subtree delegated to
// slurmd (cgroup.go). There is no slurmdbd: finished jobs go to a
// jobcomp/filetxt file, which sacct reads with -c. Each cluster has ports
// of its own, so two can share cn.
//
// Cleanup cancels every job, waits (bounded) until the queue is empty,
// then kills slurmd, slurmctld and munged by PID (their process groups);
// slurmstepd processes left in cn go when the namespace is removed.

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/syncbuf"
)

// SlurmNode is the name of the cluster's one node.
const SlurmNode = "cn1"

// SlurmOptions configures StartSlurm.
type SlurmOptions struct {
	// CPUs is the node's CPU count as Slurm sees it (default 24).
	CPUs int
	// Partitions are extra partitions on the node, besides the default
	// "batch".
	Partitions []string
	// PlugStack is the content of plugstack.conf (SPANK plugins).
	PlugStack string
	// User owns the work directory (Slurm.Work) that jobs run in.
	User *User
	// CgroupV2 runs the node with ProctrackType=proctrack/cgroup and
	// TaskPlugin=task/cgroup on cgroup v2 (cgroup.conf: CgroupPlugin=
	// cgroup/v2, IgnoreSystemd=yes), in a cgroup subtree of its own
	// (Slurm.Cgroup), as most sites run it.
	CgroupV2 bool
	// FirstJobID is the first job id (default Slurm's, 1): a second
	// cluster in one topology takes ids the first will not reach, so
	// that the gateway never sees one job id from two clusters.
	FirstJobID int
}

// Slurm is a running one-node cluster. Its methods are safe for
// concurrent use.
type Slurm struct {
	// Dir holds the configuration, state and logs; Conf is slurm.conf.
	Dir, Conf string
	// Work is a directory owned by SlurmOptions.User, where jobs start
	// and write their output.
	Work string
	// JobComp is the job completion log (jobcomp/filetxt).
	JobComp string
	// Cgroup is, with SlurmOptions.CgroupV2, the directory of the cgroup
	// v2 subtree delegated to slurmd, in the test's own mount namespace;
	// slurmd sees it as /sys/fs/cgroup.
	Cgroup string

	tp       *Topology
	ctld, sd *Process
}

// StartSlurm starts munged, slurmctld and slurmd in cn and waits until the
// node is idle.
func (tp *Topology) StartSlurm(t testing.TB, o SlurmOptions) *Slurm {
	t.Helper()
	for _, b := range []string{"munged", "slurmctld", "slurmd", "sbatch", "sacct"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("StartSlurm: %s not installed (scripts/setup.sh installs slurmctld slurmd slurm-client munge): %v", b, err)
		}
	}
	if o.CPUs == 0 {
		o.CPUs = 24
	}
	s := &Slurm{Dir: TempDir(t), tp: tp}
	s.Conf = filepath.Join(s.Dir, "slurm.conf")
	s.JobComp = filepath.Join(s.Dir, "log", "jobcomp.txt")
	s.Work = filepath.Join(s.Dir, "work")
	for _, d := range []string{"munge-key", "munge", "ctld", "spool/" + SlurmNode, "log", "work"} {
		mode := os.FileMode(0o755)
		if d == "munge-key" {
			mode = 0o700
		}
		if err := os.MkdirAll(filepath.Join(s.Dir, d), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(s.Dir, d), mode); err != nil {
			t.Fatal(err)
		}
	}
	if o.User != nil {
		if err := os.Chown(s.Work, o.User.UID, o.User.GID); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 1024)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(s.Dir, "munge-key", "munge.key")
	sock := filepath.Join(s.Dir, "munge", "munge.socket")
	if err := os.WriteFile(keyFile, key, 0o400); err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	plugins, gres := "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n", ""
	if o.CgroupV2 {
		// DebugFlags: the cgroups Slurm makes and the device filters it
		// attaches are logged (tests read them).
		plugins = "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\nDebugFlags=CGROUP\nSlurmdDebug=verbose\nGresTypes=gpu\n"
		gres = " Gres=gpu:1"
	}
	if o.FirstJobID > 0 {
		plugins += fmt.Sprintf("FirstJobId=%d\n", o.FirstJobID)
	}
	parts := ""
	for _, p := range o.Partitions {
		parts += fmt.Sprintf("PartitionName=%s Nodes=%s MaxTime=INFINITE State=UP\n", p, SlurmNode)
	}
	conf := fmt.Sprintf(`# Written by the Airlock test harness (test/topology/slurm.go).
ClusterName=airlocktest
SlurmctldHost=%[1]s(%[2]s)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[3]s
StateSaveLocation=%[4]s/ctld
SlurmdSpoolDir=%[4]s/spool/%%n
SlurmctldPidFile=%[4]s/slurmctld.pid
SlurmdPidFile=%[4]s/slurmd.%%n.pid
SlurmctldLogFile=%[4]s/log/slurmctld.log
SlurmdLogFile=%[4]s/log/slurmd.%%n.log
SlurmctldPort=%[9]d
SlurmdPort=%[10]d
%[11]sJobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=%[5]s
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=3
MinJobAge=600
InactiveLimit=0
PlugStackConfig=%[4]s/plugstack.conf
NodeName=%[6]s NodeAddr=%[2]s CPUs=%[7]d%[12]s State=UNKNOWN
PartitionName=batch Nodes=%[6]s Default=YES MaxTime=INFINITE State=UP
%[8]s`, host, tp.CNAddr, sock, s.Dir, s.JobComp, SlurmNode, o.CPUs, parts, tp.Port(), tp.Port(), plugins, gres)
	files := map[string]string{"slurm.conf": conf, "plugstack.conf": o.PlugStack}
	if o.CgroupV2 {
		files["cgroup.conf"] = cgroupConf
		files["gres.conf"] = fmt.Sprintf("NodeName=%s Name=gpu File=%s\n", SlurmNode, SlurmGPU)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(s.Dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	m := s.start(t, "munged", "--foreground", "--force", "--key-file="+keyFile, "--socket="+sock,
		"--pid-file="+filepath.Join(s.Dir, "munge", "munged.pid"), "--seed-file="+filepath.Join(s.Dir, "munge-key", "seed"),
		"--log-file="+filepath.Join(s.Dir, "log", "munged.log"))
	tp.waitFor(t, m, 10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })
	s.ctld = s.start(t, "slurmctld", "-D", "-f", s.Conf)
	slurmd := s.Command(context.Background(), nil, "slurmd", "-D", "-N", SlurmNode, "-f", s.Conf)
	slurmd.Dir = s.Dir
	if o.CgroupV2 {
		var hybrid bool
		s.Cgroup, hybrid = delegateCgroup(t)
		preload := ""
		if hybrid {
			preload = buildCgroup2Only(t)
		}
		if err := inCgroup(slurmd, s.Cgroup, preload); err != nil {
			t.Fatal(err)
		}
	}
	s.sd = startProcess(t, slurmd, s.tp.CN+": "+strings.Join(slurmd.Args, " "))
	t.Cleanup(func() { s.drain(t) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out, stderr := s.Run(t, 10*time.Second, nil, "sinfo", "-h", "-p", "batch", "-o", "%T")
		if code == 0 && strings.TrimSpace(out) == "idle" {
			return s
		}
		if ok, _ := s.sd.Exited(); ok || time.Now().After(deadline) {
			t.Fatalf("StartSlurm: node not idle after 30 s: sinfo: exit %d, %q %s%s", code, out, stderr, s.Logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// SlurmGPU is the device file of the node's one GRES (gpu:1) with
// SlurmOptions.CgroupV2: a job that does not ask for it (a gres=gpu:1 request)
// cannot open it (ConstrainDevices=yes).
const SlurmGPU = "/dev/full"

// cgroupConf is the cluster's cgroup.conf with SlurmOptions.CgroupV2.
// IgnoreSystemd: slurmd is not a systemd unit here, so Slurm makes the
// stepd scope itself (CgroupAutomount enables the controllers on its
// way); a site under systemd leaves both out (docs/slurm.md). Devices
// are constrained: on cgroup v2 that is an eBPF program on the job's
// cgroup, which needs no controller, and denies the GRES devices the job
// was not given (here SlurmGPU) and allows every other one. Cores and
// memory are not: the test host's v2 hierarchy has no cpuset or memory
// controller to constrain with (cgroup.go).
const cgroupConf = `# Written by the Airlock test harness (test/topology/slurm.go).
CgroupPlugin=cgroup/v2
IgnoreSystemd=yes
CgroupAutomount=yes
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=yes
`

// start starts a Slurm daemon in cn, as root, in the directory Dir.
func (s *Slurm) start(t testing.TB, name string, args ...string) *Process {
	t.Helper()
	cmd := s.Command(context.Background(), nil, name, args...)
	cmd.Dir = s.Dir
	return startProcess(t, cmd, s.tp.CN+": "+name+" "+strings.Join(args, " "))
}

// Command returns a command that runs name in cn as u (nil: root) with
// SLURM_CONF set, in the work directory, with /dev/net/tun of mode
// UserTUNMode (see TUNNode), killed with its process group when ctx is
// done.
func (s *Slurm) Command(ctx context.Context, u *User, name string, args ...string) *exec.Cmd {
	// Every command, slurmd too, sees the topology's /dev/net/tun; the
	// jobs that slurmd starts inherit it.
	argv := append([]string{"--net=" + filepath.Join("/var/run/netns", s.tp.CN)}, s.tp.tun.Command(u, append([]string{name}, args...)...)...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	cmd.Dir = s.Work
	cmd.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	if u != nil {
		cmd.Env = append(cmd.Env, "HOME=/", "USER="+u.Name, "LOGNAME="+u.Name)
	}
	return cmd
}

// Run runs a Slurm command like Command with a timeout and returns its
// exit code (see ExitCode; -1 on timeout), stdout and stderr.
func (s *Slurm) Run(t testing.TB, timeout time.Duration, u *User, name string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := s.Command(ctx, u, name, args...)
	var o, e syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ctx.Err() != nil {
		return -1, o.String(), e.String() + fmt.Sprintf("\n[harness: %s killed after %v timeout]", name, timeout)
	}
	return ExitCode(err), o.String(), e.String()
}

var jobIDRe = regexp.MustCompile(`^[0-9]+(;[A-Za-z0-9_-]+)?$`)

// Sbatch submits a job as u (sbatch --parsable ARGS) with the extra
// NAME=VALUE variables env in sbatch's environment, which the job
// inherits, and returns its id.
func (s *Slurm) Sbatch(t testing.TB, u *User, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := s.Command(ctx, u, "sbatch", append([]string{"--parsable"}, args...)...)
	cmd.Env = append(cmd.Env, env...)
	var o, e syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	code := ExitCode(cmd.Run())
	out, stderr := o.String(), e.String()
	id := strings.TrimSpace(out)
	if code != 0 || !jobIDRe.MatchString(id) {
		t.Fatalf("sbatch %s: exit %d, %q, %s%s", strings.Join(args, " "), code, out, stderr, s.Logs())
	}
	id, _, _ = strings.Cut(id, ";")
	return id
}

// State returns the job's state as squeue shows it (PENDING, RUNNING, …),
// or "" once it has left the queue.
func (s *Slurm) State(t testing.TB, id string) string {
	t.Helper()
	_, out, _ := s.Run(t, 10*time.Second, nil, "squeue", "-h", "-j", id, "-o", "%T")
	return strings.TrimSpace(out)
}

// WaitState waits up to timeout until every task of job id (an array
// job's too) is in state want ("" meaning: left the queue).
func (s *Slurm) WaitState(t testing.TB, id, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := s.State(t, id)
		all := true
		for _, st := range strings.Fields(got) {
			all = all && st == want
		}
		if (want == "" && got == "") || (want != "" && got != "" && all) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: state %q after %v, want %q%s", id, got, timeout, want, s.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Accounting is one job's line from sacct.
type Accounting struct {
	JobID, State, ExitCode, NodeList, User string
}

// Sacct returns the finished jobs' records (sacct -c, from the job
// completion log), by job id; array tasks are named JOBID_TASK.
func (s *Slurm) Sacct(t testing.TB) map[string]Accounting {
	t.Helper()
	code, out, stderr := s.Run(t, 30*time.Second, nil, "sacct", "-c", "-P", "-n", "--format=JobID,State,ExitCode,NodeList,User")
	if code != 0 {
		t.Fatalf("sacct -c: exit %d: %s %s", code, out, stderr)
	}
	recs := map[string]Accounting{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "|")
		if len(f) < 5 {
			continue
		}
		recs[f[0]] = Accounting{JobID: f[0], State: f[1], ExitCode: f[2], NodeList: f[3], User: f[4]}
	}
	return recs
}

// WaitAccounting waits up to timeout for job id's record in sacct.
func (s *Slurm) WaitAccounting(t testing.TB, id string, timeout time.Duration) Accounting {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if a, ok := s.Sacct(t)[id]; ok {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: no sacct record after %v (queue: %q)%s", id, timeout, s.State(t, id), s.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Logs returns the tails of slurmctld's and slurmd's logs, for failure
// messages.
func (s *Slurm) Logs() string {
	var b strings.Builder
	for _, f := range []string{"slurmctld.log", "slurmd." + SlurmNode + ".log"} {
		data, _ := os.ReadFile(filepath.Join(s.Dir, "log", f))
		fmt.Fprintf(&b, "\n--- %s (tail) ---\n%s", f, tail(string(data), 3000))
	}
	return b.String()
}

// drain cancels every job and waits up to 20 s for the queue to empty, so
// that no job's processes outlive the cluster.
func (s *Slurm) drain(t testing.TB) {
	if ok, _ := s.ctld.Exited(); ok {
		return
	}
	_, out, _ := s.Run(t, 10*time.Second, nil, "squeue", "-h", "-o", "%A")
	ids := strings.Fields(out)
	if len(ids) == 0 {
		return
	}
	s.Run(t, 10*time.Second, nil, "scancel", ids...)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, out, _ := s.Run(t, 10*time.Second, nil, "squeue", "-h", "-o", "%A"); strings.TrimSpace(out) == "" {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("slurm cleanup: jobs still queued 20 s after scancel: %v", ids)
}

// SpankPlugin is the file name of Airlock's SPANK plugin; SpankWrapper
// its task wrapper (slurm/).
const (
	SpankPlugin  = "spank_airlock.so"
	SpankWrapper = "airlock-slurm-task"
)

// BuildSpank builds Airlock's SPANK plugin (make -C slurm, against the
// distribution's Slurm headers) once per process and puts it and the task
// wrapper into the shared binary directory. It returns their paths.
func BuildSpank(t testing.TB) (plugin, wrapper string) {
	t.Helper()
	b := getBuild(SpankPlugin)
	b.once.Do(func() {
		root, err := makeIn("slurm", "needs libslurm-dev")
		if err != nil {
			b.err = err
			return
		}
		if _, err := installFile(filepath.Join(root, "slurm", SpankWrapper), SpankWrapper, 0o755); err != nil {
			b.err = err
			return
		}
		b.path, b.err = installFile(filepath.Join(root, "slurm", SpankPlugin), SpankPlugin, 0o644)
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", SpankPlugin, b.err)
	}
	return b.path, filepath.Join(filepath.Dir(b.path), SpankWrapper)
}
