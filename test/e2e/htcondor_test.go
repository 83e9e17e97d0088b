// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestHTCondorWrapper runs htcondor/airlock-condor-wrapper the way
// condor_starter runs a USER_JOB_WRAPPER: as the job's user, in the job's
// scratch directory, with a clean environment holding the _CONDOR_*
// variables, the job ad in $_CONDOR_JOB_AD and the executable and its
// arguments as the wrapper's arguments. (HTCondor itself is not packaged
// for Debian 12.)
//
// The gateway checks MUNGE credentials (--attest munge) with a key the
// execute node's munged shares: a job whose settings hold no token joins
// with one, its uid and node attested and its job id claimed (HTCondor's
// starter cannot vouch for it, docs/security.md).
func TestHTCondorWrapper(t *testing.T) {
	// The cluster's own munged on MUNGE's default socket, with another
	// key (issue 33, item 1): the site's settings name the dedicated one.
	mungetest.StartDecoy(t)
	key := mungetest.NewKey(t)
	var nodeMunge *mungetest.Daemon
	e := newEnvHook(t, modeUser, nil, func(e *env) []string {
		nodeMunge = mungetest.Start(t, mungetest.Options{Key: key, Origin: e.tp.CNAddr.String(), Wrap: inNetns(e.tp.CN)})
		gw := mungetest.Start(t, mungetest.Options{Key: key, Wrap: inNetns(e.tp.DMZ)})
		return []string{"--attest", "munge", "--munge-socket", gw.Socket}
	})
	root, err := topology.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "htcondor", "airlock-condor-wrapper"))
	if err != nil {
		t.Fatal(err)
	}
	dir := topology.TempDir(t)
	wrapper := filepath.Join(dir, "airlock-condor-wrapper")
	if err := os.WriteFile(wrapper, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// The site's join settings, readable by jobs.
	envFile := filepath.Join(dir, "condor.env")
	if err := os.WriteFile(envFile, []byte(fmt.Sprintf("# airlock for HTCondor jobs\nAIRLOCK_GATEWAY=%s\nAIRLOCK_PIN=%s\nAIRLOCK_TOKEN=%s\nAIRLOCK_MUNGE_SOCKET=%s\n", e.gateway, e.pin, e.token, nodeMunge.Socket)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The job's executable, as HTCondor transfers it into the scratch
	// directory.
	job := fmt.Sprintf("#!/bin/sh\necho \"args: $*\"\ncurl -sS --max-time 30 http://%s:%d/small | sha256sum\nexit ${EXIT:-0}\n", zoneName, e.httpPort)

	starter := func(t *testing.T, n int, ad string, env ...string) (code int, stdout, stderr, errFile string) {
		t.Helper()
		scratch := filepath.Join(dir, fmt.Sprintf("dir_%d", n))
		if err := os.Mkdir(scratch, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(scratch, e.u.UID, e.u.GID); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{".job.ad": ad, ".machine.ad": "Name = \"slot1@cn\"\n", "condor_exec.exe": job} {
			if err := os.WriteFile(filepath.Join(scratch, name), []byte(content), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		errPath := filepath.Join(scratch, ".wrapper_error")
		argv := append([]string{"-i", "-C", scratch,
			"PATH=" + filepath.Dir(e.airlock) + ":/usr/bin:/bin", "HOME=" + scratch,
			"_CONDOR_SCRATCH_DIR=" + scratch, "_CONDOR_SLOT=slot1",
			"_CONDOR_JOB_AD=" + filepath.Join(scratch, ".job.ad"), "_CONDOR_MACHINE_AD=" + filepath.Join(scratch, ".machine.ad"),
			"_CONDOR_WRAPPER_ERROR_FILE=" + errPath, "AIRLOCK_ENV_FILE=" + envFile}, env...)
		argv = append(argv, wrapper, filepath.Join(scratch, "condor_exec.exe"), "alpha", "two words")
		code, stdout, stderr = e.tp.Run(t, 60*time.Second, e.tp.CN, e.u, "env", argv...)
		b, _ := os.ReadFile(errPath)
		return code, stdout, stderr, string(b)
	}
	const globalID = "schedd.example.org#12.0#1700000000"
	ad := fmt.Sprintf("ClusterId = 12\nProcId = 0\nGlobalJobId = %q\nOwner = %q\n", globalID, e.u.Name)

	t.Run("JobThroughAirlock", func(t *testing.T) {
		code, out, stderr, _ := starter(t, 1, ad)
		if code != 0 || !strings.Contains(out, "args: alpha two words") || !strings.Contains(out, e.sha["small"]) || !strings.Contains(stderr, "airlock: mode") {
			t.Fatalf("wrapper: exit %d, stdout %q, want the arguments and the download through airlock%s", code, out, e.diag(stderr))
		}
		// The gateway names the job by HTCondor's GlobalJobId.
		log, _ := os.ReadFile(filepath.Join(e.state, gatewayFlowLog))
		if !strings.Contains(string(log), `"job_id":"`+globalID+`"`) {
			t.Errorf("flow log has no flow of job %s:\n%s", globalID, lastChars(string(log), 2000))
		}
	})
	t.Run("ExitStatus", func(t *testing.T) {
		if code, out, stderr, _ := starter(t, 2, ad, "EXIT=3"); code != 3 {
			t.Errorf("wrapper with a job exiting 3: exit %d, %q%s", code, out, e.diag(stderr))
		}
	})
	t.Run("OptOut", func(t *testing.T) {
		code, out, stderr, _ := starter(t, 3, ad+"AirlockMode = \"off\"\n")
		if strings.Contains(stderr, "airlock: mode") || strings.Contains(out, e.sha["small"]) || !strings.Contains(out, "args: alpha two words") {
			t.Errorf("AirlockMode = \"off\": exit %d, %q, %q: want the job run directly, without network", code, out, stderr)
		}
	})
	t.Run("AttestedNoToken", func(t *testing.T) {
		noToken := filepath.Join(dir, "condor-attest.env")
		if err := os.WriteFile(noToken, []byte(fmt.Sprintf("AIRLOCK_GATEWAY=%s\nAIRLOCK_PIN=%s\nAIRLOCK_MUNGE_SOCKET=%s\n", e.gateway, e.pin, nodeMunge.Socket)), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, stderr, errFile := starter(t, 6, ad, "AIRLOCK_ENV_FILE="+noToken)
		if code != 0 || !strings.Contains(out, e.sha["small"]) {
			t.Fatalf("wrapper with no token, munged on the node: exit %d, %q, error file %q%s", code, out, errFile, e.diag(stderr))
		}
		want := regexp.MustCompile(`"job_id":"` + regexp.QuoteMeta(globalID) + `"[^\n]*"attested_by":"munge","attested_uid":` + strconv.Itoa(e.u.UID) + `[,}]`)
		deadline := time.Now().Add(10 * time.Second)
		for {
			log, _ := os.ReadFile(filepath.Join(e.state, gatewayFlowLog))
			if m := want.Find(log); m != nil {
				if strings.Contains(string(m), "job_attested") {
					t.Errorf("HTCondor job id recorded as attested: %s", m)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("flow log has no record of job %s with its uid attested:\n%s", globalID, lastChars(string(log), 2000))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Without munged and without a token: held, with the reason.
		code, _, _, errFile = starter(t, 7, ad, "AIRLOCK_ENV_FILE="+noToken, "AIRLOCK_MUNGE_SOCKET=/nonexistent")
		if code == 0 || !strings.Contains(errFile, "no munged socket at /nonexistent") {
			t.Errorf("no token, no munged: exit %d, error file %q", code, errFile)
		}
	})
	t.Run("HoldReason", func(t *testing.T) {
		code, _, stderr, errFile := starter(t, 4, ad, "AIRLOCK_ENV_FILE=/nonexistent")
		if code == 0 || !strings.Contains(errFile, "AIRLOCK_GATEWAY, AIRLOCK_PIN and AIRLOCK_TOKEN must be set") {
			t.Errorf("without join settings: exit %d, error file %q, stderr %q: want a failure and the reason in _CONDOR_WRAPPER_ERROR_FILE", code, errFile, stderr)
		}
		code, _, _, errFile = starter(t, 5, ad+"AirlockMode = \"bogus\"\n")
		if code == 0 || !strings.Contains(errFile, `AirlockMode = "bogus"`) {
			t.Errorf("AirlockMode = \"bogus\": exit %d, error file %q", code, errFile)
		}
	})
}
