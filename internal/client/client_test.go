// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestJobInfo(t *testing.T) {
	ad := filepath.Join(t.TempDir(), "job.ad")
	if err := os.WriteFile(ad, []byte("ClusterId = 12\nGlobalJobId = \"schedd#12.0#1700000000\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		env        map[string]string
		id, system string
	}{
		{map[string]string{"SLURM_JOB_ID": "4242"}, "4242", "slurm"},
		{map[string]string{"PBS_JOBID": "7.pbs", "SLURM_JOB_ID": "1"}, "1", "slurm"},
		{map[string]string{"AIRLOCK_JOB_ID": "mine", "SLURM_JOB_ID": "1"}, "mine", "airlock"},
		{map[string]string{"_CONDOR_JOB_AD": ad}, "schedd#12.0#1700000000", "htcondor"},
		{map[string]string{"_CONDOR_JOB_AD": "/nonexistent"}, "", ""},
		{nil, "", ""},
	}
	host, _ := os.Hostname()
	for _, tt := range tests {
		ji := jobInfo(func(k string) string { return tt.env[k] }, []string{"/usr/bin/python3", "x.py"})
		if ji.BatchJobID != tt.id || ji.BatchSystem != tt.system {
			t.Errorf("env %v: got %q/%q, want %q/%q", tt.env, ji.BatchJobID, ji.BatchSystem, tt.id, tt.system)
		}
		if ji.Command != "python3" || ji.UID != os.Getuid() {
			t.Errorf("env %v: command %q uid %d", tt.env, ji.Command, ji.UID)
		}
		if ji.Hostname != host {
			t.Errorf("env %v: host %q, want %q", tt.env, ji.Hostname, host)
		}
	}
	// Slurm's node name wins over the kernel's host name, for Slurm jobs.
	for _, tt := range []struct {
		env  map[string]string
		host string
	}{
		{map[string]string{"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "cn17"}, "cn17"},
		{map[string]string{"AIRLOCK_JOB_ID": "x", "SLURMD_NODENAME": "cn17"}, host},
	} {
		if ji := jobInfo(func(k string) string { return tt.env[k] }, nil); ji.Hostname != tt.host {
			t.Errorf("env %v: host %q, want %q", tt.env, ji.Hostname, tt.host)
		}
	}
}

func TestResolveEndpoint(t *testing.T) {
	tests := []struct {
		endpoint, control, want string
	}{
		{"198.51.100.1:8443", "gw.example:8443", "198.51.100.1:8443"},
		{"0.0.0.0:9000", "198.51.100.9:8443", "198.51.100.9:9000"},
		{":9000", "198.51.100.9:8443", "198.51.100.9:9000"},
		{"localhost:51820", "x:1", "127.0.0.1:51820"},
	}
	for _, tt := range tests {
		got, err := resolveEndpoint(context.Background(), tt.endpoint, tt.control)
		if err != nil || got != netip.MustParseAddrPort(tt.want) {
			t.Errorf("resolveEndpoint(%q, %q): got %v, %v; want %s", tt.endpoint, tt.control, got, err, tt.want)
		}
	}
	if _, err := resolveEndpoint(context.Background(), "no-port", "x:1"); err == nil || !strings.Contains(err.Error(), "bad endpoint") {
		t.Errorf("bad endpoint: got %v", err)
	}
}

func TestRunRefusesMissingSettings(t *testing.T) {
	// --attest off: on a node where munged runs, a join without a token
	// is an attested join, not missing settings (issue 33, item 1: make
	// test passes where munged runs).
	base := Config{Gateway: "gw:8443", Pin: "sha256:" + strings.Repeat("a", 64), Token: "alk1_x", Args: []string{"true"}, Attest: AttestOff}
	tests := []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.Args = nil }, "no command"},
		{func(c *Config) { c.Gateway = "" }, "AIRLOCK_GATEWAY"},
		{func(c *Config) { c.Pin = "" }, "AIRLOCK_PIN"},
		{func(c *Config) { c.Token = "" }, "AIRLOCK_TOKEN"},
		{func(c *Config) { c.Pin = "sha256:xyz" }, "pin"},
	}
	for _, tt := range tests {
		c := base
		tt.mut(&c)
		code, err := Run(context.Background(), c)
		if code != ExitFailure || err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("got %d, %v; want %d and an error mentioning %q", code, err, ExitFailure, tt.want)
		}
	}
}
