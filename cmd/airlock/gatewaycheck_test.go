// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/preflight"
)

// TestConfigFileCheck checks airlock gateway --check's line on the
// --config file: strict decoding, full validation, a warning per entry
// that cannot take effect.
func TestConfigFileCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(good, []byte("version = 1\n[policy]\ndefault = \"allow\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("version = 1\n[policy]\ndefualt = \"allow\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := configFileCheck(good); len(got) != 1 || got[0].Status != preflight.OK {
		t.Errorf("good config: %+v", got)
	}
	if got := configFileCheck(bad); len(got) != 1 || got[0].Status != preflight.Problem || !strings.Contains(got[0].Detail, "bad.toml:3") {
		t.Errorf("bad config: %+v, want a problem naming bad.toml:3", got)
	}
	if got := configFileCheck(filepath.Join(dir, "missing.toml")); len(got) != 1 || got[0].Status != preflight.Problem {
		t.Errorf("missing config: %+v", got)
	}
	// A valid file with an entry that cannot take effect: a warning each.
	shadow := filepath.Join(dir, "shadow.toml")
	if err := os.WriteFile(shadow, []byte("version = 1\n[[policy.rule]]\nname = \"all\"\naction = \"deny\"\n[[policy.rule]]\nname = \"web\"\naction = \"deny\"\nports = [80]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := configFileCheck(shadow); len(got) != 2 || got[0].Status != preflight.OK || got[1].Status != preflight.Warn || !strings.Contains(got[1].Name, "line 5, policy.rule[2]") || got[1].Fix == "" {
		t.Errorf("config with a shadowed rule: %+v, want ok and a warning naming line 5", got)
	}
}
