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
