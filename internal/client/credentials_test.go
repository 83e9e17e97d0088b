// SPDX-License-Identifier: MIT

package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func TestWithoutCredentials(t *testing.T) {
	env := []string{"PATH=/bin", "AIRLOCK_TOKEN=alk1_secret", "AIRLOCK_TOKEN_FILE=/run/tok", "AIRLOCK_MUNGE_JOB=MUNGE:root:", "AIRLOCK_TOKENX=keep", "HOME=/h"}
	got := withoutCredentials(env)
	want := []string{"PATH=/bin", "AIRLOCK_TOKENX=keep", "HOME=/h"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestResolveToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "alk1_abc\n")
	tests := []struct {
		name      string
		cfg       Config
		want, err string
	}{
		{"flag", Config{Token: "alk1_x"}, "alk1_x", ""},
		{"file", Config{TokenFile: good}, "alk1_abc", ""},
		{"file with spaces", Config{TokenFile: write("sp", "  alk1_abc \r\n\n")}, "alk1_abc", ""},
		{"both", Config{Token: "alk1_x", TokenFile: good}, "", "give one"},
		{"none", Config{}, "", "no join token"},
		{"missing file", Config{TokenFile: filepath.Join(dir, "nope")}, "", "no such file"},
		{"empty file", Config{TokenFile: write("empty", "\n")}, "", "one token"},
		{"two tokens", Config{TokenFile: write("two", "a\nb\n")}, "", "one token"},
		{"huge file", Config{TokenFile: write("huge", strings.Repeat("a", 5000))}, "", "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := resolveToken(tt.cfg)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %q, %v; want error containing %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestHideFromJob checks, in a child process running as an unprivileged
// user, that after hideFromJob a process of the same uid cannot read the
// child's environment (where AIRLOCK_TOKEN may be), and that it can
// without (so the check is not blind).
func TestHideFromJob(t *testing.T) {
	if mode := os.Getenv("AIRLOCK_TEST_HIDE"); mode != "" {
		if mode == "hide" {
			if err := hideFromJob(); err != nil {
				t.Fatal(err)
			}
		}
		out, err := exec.Command("/bin/sh", "-c", "cat /proc/$PPID/environ").CombinedOutput()
		readable := err == nil && strings.Contains(string(out), "AIRLOCK_TOKEN=alk1_test")
		if readable != (mode == "show") {
			t.Fatalf("mode %s: a process of the same uid read the environment: %v (%v)", mode, readable, err)
		}
		return
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run the child as another user (root reads every environment)")
	}
	// The test binary, where an unprivileged user can run it.
	dir, err := os.MkdirTemp("", "airlock-hide-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	self, _ := os.Executable()
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client.test")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"show", "hide"} {
		cmd := exec.Command(bin, "-test.run=^TestHideFromJob$", "-test.count=1")
		cmd.Dir = dir
		cmd.Env = []string{"AIRLOCK_TEST_HIDE=" + mode, "AIRLOCK_TOKEN=alk1_test", "PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", mode, err, out)
		}
	}
}
