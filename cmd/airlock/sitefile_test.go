// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestApplySiteFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "airlock.env")
	site := "AIRLOCK_GATEWAY=site.example:8443\nAIRLOCK_PIN=sha256:51\nAIRLOCK_MODE=proxy\nAIRLOCK_TRANSPORT=tcp\nAIRLOCK_BIN=/usr/bin/airlock\nAIRLOCK_NO_SUCH=1\n"
	if err := os.WriteFile(p, []byte(site), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want map[string]string // flag → "VALUE|SOURCE prefix"
	}{
		{name: "site fills the gaps", args: []string{"--site-file", p},
			want: map[string]string{"gateway": "site.example:8443|site file " + p + ":1", "pin": "sha256:51|site file " + p + ":2",
				"mode": "proxy|site file", "transport": "tcp|site file", "token": "|default"}},
		{name: "flag and environment win", args: []string{"--site-file", p, "--mode", "netns"},
			env:  map[string]string{"AIRLOCK_TRANSPORT": "udp"},
			want: map[string]string{"mode": "netns|command line", "transport": "udp|environment AIRLOCK_TRANSPORT", "gateway": "site.example:8443|site file"}},
		{name: "the job's gateway keeps the site's pin away", args: []string{"--site-file", p},
			env:  map[string]string{"AIRLOCK_GATEWAY": "own.example:8443", "AIRLOCK_SITE_FILE": p},
			want: map[string]string{"gateway": "own.example:8443|environment AIRLOCK_GATEWAY", "pin": "|default: the job set --gateway", "mode": "proxy|site file"}},
		{name: "site file from the environment", env: map[string]string{"AIRLOCK_SITE_FILE": p},
			want: map[string]string{"site-file": p + "|environment AIRLOCK_SITE_FILE", "gateway": "site.example:8443|site file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			cmd := newRunCmd(io.Discard, io.Discard)
			if err := cmd.ParseFlags(append(tt.args, "--", "true")); err != nil {
				t.Fatal(err)
			}
			if err := applyEnv(cmd, getenv); err != nil {
				t.Fatal(err)
			}
			var warn bytes.Buffer
			sf, _ := cmd.Flags().GetString(siteFileFlag)
			settings, err := applySiteFile(cmd, sf, getenv, &warn)
			if err != nil {
				t.Fatal(err)
			}
			for flag, w := range tt.want {
				wantVal, wantSrc, _ := strings.Cut(w, "|")
				var got *setting
				for i := range settings {
					if settings[i].Flag == flag {
						got = &settings[i]
					}
				}
				if got == nil || got.Value != wantVal || !strings.HasPrefix(got.Source, wantSrc) {
					t.Errorf("--%s: got %+v, want value %q from %q", flag, got, wantVal, wantSrc)
				}
			}
			if w := warn.String(); !strings.Contains(w, "AIRLOCK_NO_SUCH is no setting of airlock run") || strings.Contains(w, "AIRLOCK_BIN") {
				t.Errorf("warnings %q: want one for AIRLOCK_NO_SUCH, none for the HTCondor wrapper's AIRLOCK_BIN", w)
			}
		})
	}
}

func TestRunSiteFileRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "airlock.env")
	if err := os.WriteFile(p, []byte("AIRLOCK_GATEWAY=gw:1\nAIRLOCK_PIN=sha256:00\nAIRLOCK_TOKEN=alk1_secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"run", "--site-file", p, "--", "true"}, &stdout, &stderr)
	if code != 125 || !strings.Contains(stderr.String(), "holds AIRLOCK_TOKEN") || strings.Contains(stderr.String(), "alk1_secret") {
		t.Errorf("world-readable site file with a token: exit %d, stderr %q; want 125, the refusal, and not the token", code, stderr.String())
	}
	stderr.Reset()
	code = run([]string{"run", "--site-file", p + ".none", "--", "true"}, &stdout, &stderr)
	if code != 125 || !strings.Contains(stderr.String(), "no such file") {
		t.Errorf("named site file missing: exit %d, stderr %q; want 125 and the error", code, stderr.String())
	}
}
