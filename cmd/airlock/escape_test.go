// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

func TestHuman(t *testing.T) {
	for in, want := range map[string]string{
		"slurm-42":           "slurm-42",
		"müller":             "müller",
		"my job.sh":          "my job.sh",
		"42\x1b[2J":          `"42\x1b[2J"`,
		"a\nb":               `"a\nb"`,
		"a\tb":               `"a\tb"`,
		"txt.\u202eexe":      `"txt.\u202eexe"`,
		"\xff":               `"\xff"`,
		"":                   "",
		"ok\u200bzero-width": `"ok\u200bzero-width"`,
	} {
		if got := human(in); got != want {
			t.Errorf("human(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestStatusEscapes checks that airlock status shows a job's fields
// escaped: a terminal escape, a newline or a tab sent by a client (from a
// history written before join validation, or by another gateway version)
// cannot reach the admin's terminal raw.
func TestStatusEscapes(t *testing.T) {
	st := admin.Status{Jobs: []admin.JobStatus{{
		JobStats: flows.JobStats{Lease: "l1", Ref: jobs.Ref{JobID: "42\x1b]0;pwned\x07", Token: "t"}},
		Host:     "cn1\nFAKE LINE", User: "root\tx", Started: time.Unix(0, 0),
	}}}
	var b bytes.Buffer
	if err := printStatus(&b, st, jobFilter{}, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.ContainsAny(out, "\x1b\x07\t") || strings.Contains(out, "\nFAKE LINE") {
		t.Errorf("status output holds raw control characters:\n%q", out)
	}
	for _, want := range []string{`"42\x1b]0;pwned\a"`, `"cn1\nFAKE LINE"`, `"root\tx"`} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %s:\n%s", want, out)
		}
	}
}

// TestLogEscapes checks that the gateway's log quotes client text with
// control characters: a forged log line cannot be injected.
func TestLogEscapes(t *testing.T) {
	var b bytes.Buffer
	log, err := newLogger(&b, "info")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("job joined", "job", "42\nlevel=ERROR msg=forged", "host", "cn1\x1b[2J", "err", errors.New("bad\rline"))
	out := b.String()
	if strings.Count(out, "\n") != 1 || strings.ContainsAny(out, "\x1b\r") {
		t.Errorf("log line holds raw control characters: %q", out)
	}
}
