// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// bigStatus is a gateway's status with n jobs of 4 tokens, 100 users and
// 500 nodes; every 10th job's uid and node are attested.
func bigStatus(n int) admin.Status {
	st := admin.Status{Mode: "user"}
	base := netip.MustParseAddr("100.64.0.2")
	a := base
	for i := range n {
		j := admin.JobStatus{
			JobStats: flows.JobStats{Addr: a, Lease: jobs.ID(fmt.Sprintf("lease%05d", i)),
				Ref: jobs.Ref{JobID: fmt.Sprint(1000 + i), Token: []string{"cms-pilots", "atlas", "lhcb", "alice"}[i%4]}, ActiveFlows: 2},
			User: fmt.Sprintf("user%03d", i%100), ClaimedUID: 2000 + i%100, Host: fmt.Sprintf("wn%03d", i%500),
		}
		if i%10 == 0 {
			j.Attested = &identity.Attestation{By: "munge", UID: uint32(2000 + i%100), User: j.User, Job: &identity.AttestedJob{Node: j.Host}}
		}
		st.Jobs = append(st.Jobs, j)
		a = a.Next()
	}
	return st
}

func TestStatusTenThousandJobs(t *testing.T) {
	st := bigStatus(10000)
	var b bytes.Buffer
	if err := printStatus(&b, st, jobFilter{}, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if n := strings.Count(out, "\n"); n > 60 {
		t.Errorf("status of 10,000 jobs: %d lines, want a summary of at most 60:\n%s", n, out)
	}
	for _, want := range []string{
		"jobs:       10000\n",
		"TOKEN", "cms-pilots", "2500", // 10,000 / 4 tokens
		"USER", "user000", "(and 90 more)",
		"NODE", "wn000", "(and 490 more)",
		"select some with --token, --user or --node, or list them all with --all",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "lease00042") {
		t.Errorf("summary lists single jobs:\n%s", out)
	}

	// Filters narrow down to a list: user007 on wn007 is 20 jobs
	// (i%100 == 7 and i%500 == 7).
	b.Reset()
	if err := printStatus(&b, st, jobFilter{user: "user007", node: "wn007"}, false); err != nil {
		t.Fatal(err)
	}
	out = b.String()
	if !strings.Contains(out, "jobs:       10000, 20 of them selected") || strings.Count(out, "lease") != 20 || !strings.Contains(out, "lease00007") {
		t.Errorf("--user user007 --node wn007: want the 20 jobs listed:\n%s", out)
	}
	b.Reset()
	if err := printStatus(&b, st, jobFilter{token: "atlas"}, false); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "2500 of them selected") || !strings.Contains(out, "2500 jobs are too many") {
		t.Errorf("--token atlas: want 2500 selected and summarized:\n%s", out)
	}
	b.Reset()
	if err := printStatus(&b, st, jobFilter{token: "atlas"}, true); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n"); n < 2500 {
		t.Errorf("--token atlas --all: %d lines, want every one of 2500 jobs", n)
	}
}
