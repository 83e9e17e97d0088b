// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunModeFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"run", "--gateway", "gw.example:8443", "--pin", "sha256:00", "--token", "t", "--mode", "socks", "--", "true"}, &stdout, &stderr)
	if code != 125 || !strings.Contains(stderr.String(), `bad --mode "socks": want auto, netns, seccomp, preload or proxy`) {
		t.Errorf("--mode socks: exit %d, stderr %q; want 125 and the valid modes", code, stderr.String())
	}
}

func TestRunTokenFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	// A bad --mode stops airlock before it joins: only the flags count.
	run([]string{"run", "--gateway", "gw.example:8443", "--pin", "sha256:00", "--token", "t", "--mode", "x", "--", "true"}, &stdout, &stderr)
	if !strings.Contains(stderr.String(), "--token on the command line is visible to every user") {
		t.Errorf("--token: stderr %q, want a warning", stderr.String())
	}
	stderr.Reset()
	run([]string{"run", "--gateway", "gw.example:8443", "--pin", "sha256:00", "--token-file", "/nonexistent", "--mode", "x", "--", "true"}, &stdout, &stderr)
	if strings.Contains(stderr.String(), "warning") || strings.Contains(stderr.String(), "flag provided but not defined") {
		t.Errorf("--token-file: stderr %q, want no warning", stderr.String())
	}
	stdout.Reset()
	run([]string{"run", "--help"}, &stdout, &stderr)
	if !strings.Contains(stdout.String(), "--token-file") || !strings.Contains(stdout.String(), "discouraged") {
		t.Errorf("help lacks --token-file or the warning about --token:\n%s", stdout.String())
	}
}
