package airlock

import (
	"os/exec"
	"strings"
	"testing"
)

// TestGofmt fails when a tracked or new Go file is not gofmt-formatted.
func TestGofmt(t *testing.T) {
	out, err := exec.Command("gofmt", "-l", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("gofmt: %v\n%s", err, out)
	}
	if files := strings.TrimSpace(string(out)); files != "" {
		t.Errorf("files not gofmt-formatted (run gofmt -w):\n%s", files)
	}
}
