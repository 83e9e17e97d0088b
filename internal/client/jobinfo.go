// SPDX-License-Identifier: MIT

package client

import (
	"bufio"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
)

// batchVars maps batch systems to the environment variable holding the job
// id, in the order they are tried. AIRLOCK_JOB_ID overrides them all.
var batchVars = [...]struct{ system, env string }{
	{"airlock", "AIRLOCK_JOB_ID"},
	{"slurm", "SLURM_JOB_ID"},
	{"pbs", "PBS_JOBID"},
	{"lsf", "LSB_JOBID"},
	{"flux", "FLUX_JOB_ID"},
	{"sge", "JOB_ID"},
}

// jobInfo describes this job for the gateway's records, from the environment
// getenv reads, cleaned so that the gateway accepts it (control.JobInfo.Clean).
func jobInfo(getenv func(string) string, args []string) control.JobInfo {
	return rawJobInfo(getenv, args).Clean()
}

func rawJobInfo(getenv func(string) string, args []string) control.JobInfo {
	ji := control.JobInfo{UID: os.Getuid()}
	for _, b := range batchVars {
		if v := getenv(b.env); v != "" {
			ji.BatchJobID, ji.BatchSystem = v, b.system
			break
		}
	}
	if ji.BatchJobID == "" {
		if ad := getenv("_CONDOR_JOB_AD"); ad != "" {
			if id := condorJobID(ad); id != "" {
				ji.BatchJobID, ji.BatchSystem = id, "htcondor"
			}
		}
	}
	ji.Hostname, _ = os.Hostname()
	// The batch system's name for the node, where it differs from the
	// kernel's host name (several slurmd on one host, cloud nodes).
	if ji.BatchSystem == "slurm" {
		if v := getenv("SLURMD_NODENAME"); v != "" {
			ji.Hostname = v
		}
	}
	if u, err := user.LookupId(strconv.Itoa(ji.UID)); err == nil {
		ji.User = u.Username
	} else if v := getenv("USER"); v != "" {
		ji.User = v
	}
	if len(args) > 0 {
		ji.Command = filepath.Base(args[0])
	}
	return ji
}

// condorJobID reads GlobalJobId from an HTCondor job ad file.
func condorJobID(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if ok && strings.TrimSpace(k) == "GlobalJobId" {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return ""
}
