// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// Attested identity under Slurm (issue 25, items 1 and 2), on TestSlurm's
// cluster: the nodes' and the gateway's munged share a dedicated key, the
// SPANK plugin makes root's job credential for every task it wraps, and
// its join settings hold no token.

// plugJob submits script to partition airlock (the plugin wraps it) with
// no join settings of its own, and returns its id.
func (se *slurmEnv) plugJob(t *testing.T, script string, args ...string) string {
	t.Helper()
	args = append([]string{"-o", filepath.Join(se.s.Work, "%j.out"), "-e", filepath.Join(se.s.Work, "%j.err"), "-p", "airlock"}, args...)
	return se.s.Sbatch(t, se.u, nil, append(args, script)...)
}

// waitJob waits until status lists a live lease of Slurm job id.
func (se *slurmEnv) waitJob(t *testing.T, id string) admin.JobStatus {
	t.Helper()
	var job admin.JobStatus
	if !topology.PollEvery(60*time.Second, 100*time.Millisecond, func() bool {
		for _, j := range se.status(t).Jobs {
			if j.JobID == id {
				job = j
				return true
			}
		}
		return false
	}) {
		t.Fatalf("job %s: no lease after 60 s (state %q)\n%s%s", id, se.s.State(t, id), se.output(id), se.diag(""))
	}
	return job
}

// testAttested: a job the plugin wraps joins with MUNGE credentials and no
// token; the gateway records its uid, gid and node as the credentials
// say, and its Slurm job id as root's credential says, in status, in
// whois (text and --json) and in its flows' records.
func (se *slurmEnv) testAttested(t *testing.T) {
	id := se.plugJob(t, se.script(t, "attested", se.fetchCmd()+"; exec sleep 300"))
	defer se.s.Run(t, 10*time.Second, nil, "scancel", id)
	j := se.waitJob(t, id)
	a := j.Attested
	if a == nil || a.By != "munge" || a.UID != uint32(se.u.UID) || a.GID != uint32(se.u.GID) || a.Node != se.tp.CNAddr ||
		a.Job == nil || a.Job.JobID != id || a.Job.BatchSystem != "slurm" || a.Job.MadeBy != 0 || a.Job.Node != "cn1" || a.Job.Step != "batch" {
		t.Fatalf("status of job %s: attested %s, want uid %d gid %d on %s and Slurm job %s step batch on cn1 made by root%s",
			id, a, se.u.UID, se.u.GID, se.tp.CNAddr, id, se.diag(""))
	}
	if j.Token != "" || !j.JobAttested || j.AttestedUID == nil || *j.AttestedUID != uint32(se.u.UID) {
		t.Errorf("status job %+v: want no token, the job id and uid attested", j.Ref)
	}
	port := portOfBlock(t, j.Ports)
	code, out, stderr := se.admin(t, "whois", "--state", se.state, "--json", fmt.Sprintf("%s:%d", se.tp.DMZAddrINET, port))
	var recs []store.LeaseRecord
	if code != 0 || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || recs[0].Attested == nil || recs[0].Attested.Job == nil || recs[0].Attested.Job.JobID != id {
		t.Errorf("whois --json: exit %d, %s %s; want the attested record", code, out, stderr)
	}
	code, out, _ = se.admin(t, "whois", "--state", se.state, fmt.Sprintf("%s:%d", se.tp.DMZAddrINET, port))
	if code != 0 || !strings.Contains(out, id+" (munge)") || !strings.Contains(out, fmt.Sprintf("uid %d (munge)", se.u.UID)) || !strings.Contains(out, "cn1 "+se.tp.CNAddr.String()+" (munge)") {
		t.Errorf("whois: exit %d, %s; want the job id, uid and node marked (munge)", code, out)
	}
	// The flow log's records of its download say so too.
	attested := regexp.MustCompile(`"job_id":"` + id + `"[^\n]*"attested_by":"munge","attested_uid":` + strconv.Itoa(se.u.UID) + `,"job_attested":true`)
	var log []byte
	if !topology.Poll(15*time.Second, func() bool {
		log, _ = os.ReadFile(filepath.Join(se.state, gatewayFlowLog))
		return attested.Match(log)
	}) {
		t.Errorf("flow log has no attested record of job %s:\n%s", id, lastChars(string(log), 2000))
	}
}

// testClaimedJobID: a job that runs airlock run itself (no plugin) with
// the node's munged: its uid is attested, its job id only claimed.
func (se *slurmEnv) testClaimedJobID(t *testing.T) {
	id := se.sbatch(t, se.script(t, "claimedjob", fmt.Sprintf("exec %s run --munge-socket %s -- sleep 300", se.airlock, se.nodeMunge.Socket)))
	defer se.s.Run(t, 10*time.Second, nil, "scancel", id)
	j := se.waitJob(t, id)
	if a := j.Attested; a == nil || a.UID != uint32(se.u.UID) || a.Job != nil || j.JobAttested {
		t.Errorf("status of job %s: attested %s, job attested %v; want the uid attested and the job id claimed", id, a, j.JobAttested)
	}
	code, out, _ := se.admin(t, "status", "--state", se.state)
	if code != 0 || !strings.Contains(out, id+" (claimed)") {
		t.Errorf("status does not show job %s as claimed:\n%s", id, out)
	}
}

// testClaimsRoot: a user who makes airlock run claim uid 0 (in a user
// namespace of their own, where they are "root") is refused: the node's
// munged saw their real uid.
func (se *slurmEnv) testClaimsRoot(t *testing.T) {
	code, out, stderr := se.tp.Run(t, 60*time.Second, se.tp.CN, se.u, "env", "AIRLOCK_GATEWAY="+se.gateway, "AIRLOCK_PIN="+se.pin,
		"unshare", "--user", "--map-root-user", se.airlock, "run", "--attest", "munge", "--munge-socket", se.nodeMunge.Socket, "--", "true")
	want := fmt.Sprintf("claims uid 0 but its credential was made by uid %d", se.u.UID)
	if code != 125 || !strings.Contains(stderr, want) {
		t.Errorf("airlock run claiming uid 0: exit %d, %q %q; want 125 and %q", code, out, stderr, want)
	}
}

// testNoReusableSecret (issue 25, item 2): a job's user collects what it
// can: the environment of its own task prolog (which runs before airlock
// run, and sees root's job credential), the job's environment inside
// airlock run, and every file it can read under the plugin's and MUNGE's
// paths. No token is among it. With what it found, no second join
// succeeds: not as the job, not as another job, not from another host.
func (se *slurmEnv) testNoReusableSecret(t *testing.T) {
	loot := filepath.Join(se.s.Work, "loot")
	if err := os.Mkdir(loot, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loot, 0o777); err != nil {
		t.Fatal(err)
	}
	prolog := se.script(t, "stealprolog", fmt.Sprintf("env > %s/prolog.env 2>&1", loot))
	paths := []string{"/etc/airlock", filepath.Dir(se.nodeMunge.Socket), se.s.Dir, filepath.Dir(se.airlock)}
	body := fmt.Sprintf(`echo $SLURM_JOB_ID > %[1]s/id; env > %[1]s/job.env; cat /proc/self/environ | tr '\0' '\n' >> %[1]s/job.env
for d in %[2]s; do find "$d" -maxdepth 3 -type f -readable 2>/dev/null | while read -r f; do head -c 65536 "$f" 2>/dev/null | tr -c '[:print:]\n' '\n' | grep -E 'MUNGE:|alk1_' ; done; done > %[1]s/files.txt; true`, loot, strings.Join(paths, " "))
	// srun: --task-prolog is a step's option; the plugin wraps the step's
	// task (--airlock) and makes its job credential before the prolog runs.
	code, out, stderr := se.s.Run(t, 90*time.Second, se.u, "srun", "--airlock", "-n1", "--task-prolog="+prolog, "sh", "-c", body)
	idb, _ := os.ReadFile(filepath.Join(loot, "id"))
	id := strings.TrimSpace(string(idb))
	if code != 0 || id == "" {
		t.Fatalf("srun --airlock --task-prolog: exit %d, job %q, %s %s%s", code, id, out, stderr, se.diag(""))
	}
	var found []string
	for _, f := range []string{"prolog.env", "job.env", "files.txt"} {
		b, _ := os.ReadFile(filepath.Join(loot, f))
		found = append(found, string(b))
	}
	all := strings.Join(found, "\n") + out + stderr
	// A token is alk1_ and 43 characters (the binaries hold the prefix).
	if m := regexp.MustCompile(`alk1_[A-Za-z0-9_-]{40,}`).FindString(all); m != "" {
		t.Errorf("the job's user found a join token: %s", m)
	}
	var creds []string
	seen := map[string]bool{}
	for _, c := range regexp.MustCompile(`MUNGE:[A-Za-z0-9+/=]{20,}:`).FindAllString(all, -1) {
		if !seen[c] {
			seen[c] = true
			creds = append(creds, c)
		}
	}
	if len(creds) == 0 || !strings.Contains(found[0], "AIRLOCK_MUNGE_JOB=MUNGE:") {
		t.Fatalf("the job's task prolog did not see root's job credential (the test would be blind): %s", lastChars(found[0], 2000))
	}
	if strings.Contains(found[1], "AIRLOCK_MUNGE_JOB") {
		t.Errorf("the job's environment inside airlock run holds AIRLOCK_MUNGE_JOB")
	}
	t.Logf("the job's user found %d MUNGE credential(s) and no token", len(creds))
	peer := func(ns string, socket string, args ...string) string {
		argv := append([]string{"attestjoin", "-gateway", se.gateway, "-pin", se.pin, "-socket", socket}, args...)
		code, out, stderr := se.tp.Run(t, 60*time.Second, ns, se.u, se.peer, argv...)
		if code != 0 {
			t.Fatalf("airlock-testpeer %s: exit %d %s %s", strings.Join(argv, " "), code, out, stderr)
		}
		return out
	}
	for _, c := range creds {
		for _, tc := range []struct {
			name, ns, socket string
			args             []string
		}{
			{"as the job, from its node", se.tp.CN, se.nodeMunge.Socket, []string{"-job-cred", c, "-claim-job", id}},
			{"as another job, from its node", se.tp.CN, se.nodeMunge.Socket, []string{"-job-cred", c, "-claim-job", "99999"}},
			{"from another host (the gateway's, which has the key)", se.tp.DMZ, se.gwMunge.Socket, []string{"-job-cred", c, "-claim-job", id}},
		} {
			out := peer(tc.ns, tc.socket, tc.args...)
			if !strings.HasPrefix(out, "refused attestation_failed") {
				t.Errorf("a join %s with the found credential: %q, want refused (attestation_failed)", tc.name, out)
			}
		}
	}
}

// testReplay: one join credential presented twice: the first join gets a
// lease, the second is refused (the gateway's munged decodes a credential
// once).
func (se *slurmEnv) testReplay(t *testing.T) {
	code, out, stderr := se.tp.Run(t, 60*time.Second, se.tp.CN, se.u, se.peer, "attestjoin", "-gateway", se.gateway, "-pin", se.pin,
		"-socket", se.nodeMunge.Socket, "-n", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "ok ") || !strings.HasPrefix(lines[1], "refused attestation_failed") ||
		!strings.Contains(lines[1], "used before") {
		t.Errorf("one credential twice: exit %d, %q %s; want a lease, then a refusal saying it was used before", code, out, stderr)
	}
}

// portOfBlock is the first port of a LO-HI block.
func portOfBlock(t *testing.T, block string) int {
	t.Helper()
	lo, _, _ := strings.Cut(block, "-")
	n, err := strconv.Atoi(lo)
	if err != nil {
		t.Fatalf("port block %q", block)
	}
	return n
}

// writeConfig replaces the gateway's config file with its base (what
// TestSlurm starts it with) plus extra, and reloads it.
func (se *slurmEnv) writeConfig(t *testing.T, extra string) {
	t.Helper()
	if err := os.WriteFile(se.config, []byte(slurmGatewayConfig+extra), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := se.admin(t, "gateway", "reload", "--state", se.state); code != 0 {
		t.Fatalf("airlock gateway reload: exit %d %s %s", code, out, stderr)
	}
}

// slurmGatewayConfig is the config file TestSlurm's gateway starts with
// (what --expose-ports 8080 says).
const slurmGatewayConfig = "version = 1\n[[expose]]\nports = [\"8080\"]\n"

// waitDone waits until the tasks of an array (or single jobs) wrote n
// files *.done into dir, each holding its Slurm job id, and checks that
// every one of them completed with exit 0: a task that could not join
// never runs its script and writes nothing.
func (se *slurmEnv) waitDone(t *testing.T, dir string, n int, timeout time.Duration) {
	t.Helper()
	var m []string
	if !topology.PollEvery(timeout, 250*time.Millisecond, func() bool {
		m, _ = filepath.Glob(filepath.Join(dir, "*.done"))
		return len(m) == n
	}) {
		_, q, _ := se.s.Run(t, 10*time.Second, nil, "squeue", "-h", "-o", "%i %T %R")
		errs, _ := filepath.Glob(filepath.Join(se.s.Work, "*.err"))
		var tails []string
		for _, f := range errs {
			b, _ := os.ReadFile(f)
			if len(b) > 0 {
				tails = append(tails, filepath.Base(f)+": "+lastChars(string(b), 600))
			}
		}
		t.Fatalf("%d of %d tasks done after %v; queue:\n%s\nstderr of jobs:\n%s%s", len(m), n, timeout, q, strings.Join(tails, "\n"), se.diag(""))
	}
	for _, f := range m {
		b, _ := os.ReadFile(f)
		id := strings.TrimSpace(string(b))
		if a := se.s.WaitAccounting(t, id, 30*time.Second); a.State != "COMPLETED" || a.ExitCode != "0:0" {
			t.Errorf("job %s: %+v, want COMPLETED 0:0\n%s", id, a, se.output(id))
		}
	}
}

// testQuotaWait (issue 33, item 1): attested jobs that have to wait do
// not fail. With max_leases = 1 for each user's token-less joins
// ([quota.user], issue 33, item 3), an array of three
// tasks through the plugin (each with root's job credential, made once)
// queues at the gateway and finishes with no failed task, each task's job
// id attested; then a job submitted while the gateway drains waits and
// runs after the drain ends. All this with a munged on MUNGE's default
// socket holding another key (TestSlurm's decoy).
func (se *slurmEnv) testQuotaWait(t *testing.T) {
	se.writeConfig(t, "[quota.user]\nmax_leases = 1\n")
	defer se.writeConfig(t, "")
	dir := filepath.Join(se.s.Work, "quotawait")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	const n = 3
	body := fmt.Sprintf("set -e; %s > /dev/null; sleep 2; echo $SLURM_JOB_ID > %s/$SLURM_ARRAY_TASK_ID.done", se.fetchCmd(), dir)
	se.plugJob(t, se.script(t, "quotawait", body), fmt.Sprintf("--array=1-%d", n))
	se.waitDone(t, dir, n, 150*time.Second)

	// Across a drain.
	ddir := filepath.Join(se.s.Work, "drainwait")
	if err := os.Mkdir(ddir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ddir, 0o777); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := se.admin(t, "gateway", "drain", "--state", se.state); code != 0 {
		t.Fatalf("drain: exit %d %s %s", code, out, stderr)
	}
	undrained := false
	defer func() {
		if !undrained {
			se.admin(t, "gateway", "drain", "--state", se.state, "--undo")
		}
	}()
	id := se.plugJob(t, se.script(t, "drainwait", fmt.Sprintf("set -e; %s > /dev/null; echo $SLURM_JOB_ID > %s/1.done", se.fetchCmd(), ddir)))
	// Its first join meets the drain (the job credential is decoded
	// then), before the drain ends.
	time.Sleep(4 * time.Second)
	if m, _ := filepath.Glob(filepath.Join(ddir, "*.done")); len(m) != 0 {
		t.Fatalf("job %s ran while the gateway drained", id)
	}
	if code, out, stderr := se.admin(t, "gateway", "drain", "--state", se.state, "--undo"); code != 0 {
		t.Fatalf("drain --undo: exit %d %s %s", code, out, stderr)
	}
	undrained = true
	se.waitDone(t, ddir, 1, 90*time.Second)
}

// testBanSticks (issue 33, item 2): `airlock kick --ban` of a job the
// plugin wrapped (uid and job attested, no token) bans the person: the
// same user's job on the same node that runs airlock run --attest off
// with the token ends, and new joins of that user are refused whether
// they leave out the credential (with the token) or carry one (with no
// token). It runs last: the ban stays.
func (se *slurmEnv) testBanSticks(t *testing.T) {
	id := se.plugJob(t, se.script(t, "banned", "exec sleep 300"))
	defer se.s.Run(t, 10*time.Second, nil, "scancel", id)
	se.waitJob(t, id)
	other := se.sbatch(t, se.script(t, "unattested", fmt.Sprintf("exec %s run --attest off -- sleep 300", se.airlock)))
	defer se.s.Run(t, 10*time.Second, nil, "scancel", other)
	if j := se.waitJob(t, other); j.Attested != nil {
		t.Fatalf("job %s with --attest off: attested %s", other, j.Attested)
	}
	code, out, stderr := se.admin(t, "kick", "--state", se.state, "--ban", "1h", "--reason", "e2e ban", id)
	if code != 0 || !strings.Contains(out+stderr, "any token or none") {
		t.Fatalf("kick --ban 1h %s: exit %d %s %s; want it to say the ban covers the uid with any token", id, code, out, stderr)
	}
	if !topology.PollEvery(10*time.Second, 200*time.Millisecond, func() bool {
		for _, j := range se.status(t).Jobs {
			if j.JobID == other {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the banned user's unattested job %s on the same node still holds a lease 10 s after the ban", other)
	}
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"--attest off with the token", []string{"env", "AIRLOCK_GATEWAY=" + se.gateway, "AIRLOCK_PIN=" + se.pin, "AIRLOCK_TOKEN=" + se.token,
			se.airlock, "run", "--attest", "off", "--", "true"}},
		{"attested with no token", []string{"env", "AIRLOCK_GATEWAY=" + se.gateway, "AIRLOCK_PIN=" + se.pin,
			se.airlock, "run", "--attest", "munge", "--munge-socket", se.nodeMunge.Socket, "--", "true"}},
	} {
		code, out, stderr := se.tp.Run(t, 60*time.Second, se.tp.CN, se.u, tc.argv[0], tc.argv[1:]...)
		if code != 125 || !strings.Contains(stderr, "banned") {
			t.Errorf("the banned user's new job, %s: exit %d %q %q; want 125, banned", tc.name, code, out, stderr)
		}
	}
}
