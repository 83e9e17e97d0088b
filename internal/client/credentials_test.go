package client

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestWithoutCredentials(t *testing.T) {
	env := []string{"PATH=/bin", "AIRLOCK_TOKEN=alk1_secret", "AIRLOCK_TOKEN_FILE=/run/tok", "AIRLOCK_TOKENX=keep", "HOME=/h"}
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

// TestHideFromJob checks, in a child process, that after hideFromJob a
// process of the same uid cannot read this process's environment (where
// AIRLOCK_TOKEN may be). As root the check is meaningless (root reads
// everything), so the child drops to the harness's test uid if it can.
func TestHideFromJob(t *testing.T) {
	if os.Getenv("AIRLOCK_TEST_HIDE") == "1" {
		if err := hideFromJob(); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("sh", "-c", "cat /proc/$PPID/environ").CombinedOutput()
		if err == nil || strings.Contains(string(out), "AIRLOCK_TOKEN") {
			t.Fatalf("a child of the same uid read airlock's environment: %v %q", err, out)
		}
		return
	}
	if os.Getuid() == 0 {
		t.Skip("root reads every process's environment; the end-to-end test (TestJobSecrets) runs as an unprivileged user")
	}
	self, _ := os.Executable()
	cmd := exec.Command(self, "-test.run=^TestHideFromJob$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AIRLOCK_TEST_HIDE=1", "AIRLOCK_TOKEN=alk1_test")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
