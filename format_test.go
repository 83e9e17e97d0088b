// SPDX-License-Identifier: MIT

package airlock

import (
	"os"
	"os/exec"
	"path/filepath"
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

// TestSPDX fails when a source file git tracks lacks its licence line
// ("SPDX-License-Identifier: MIT" near the top; LICENSE has the text). A
// file under another licence names it the same way.
func TestSPDX(t *testing.T) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a checkout)", err)
	}
	var missing []string
	for _, f := range strings.Fields(string(out)) {
		if strings.Contains(f, "/testdata/") || strings.HasPrefix(f, "bench/results/") || !isSource(f) {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue // deleted in the work tree
		}
		head := b[:min(len(b), 400)]
		if !strings.Contains(string(head), "SPDX-License-Identifier: ") {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d source files lack \"SPDX-License-Identifier: MIT\" in their first lines (// in Go, /* */ in C, # in scripts and Makefiles):\n%s",
			len(missing), strings.Join(missing, "\n"))
	}
}

// isSource reports whether f is code that carries a licence line: Go, C,
// shell and gnuplot scripts, Makefiles, and executable scripts.
func isSource(f string) bool {
	switch filepath.Ext(f) {
	case ".go", ".c", ".h", ".sh", ".gp":
		return true
	}
	if filepath.Base(f) == "Makefile" {
		return true
	}
	b, err := os.ReadFile(f)
	return err == nil && strings.HasPrefix(string(b), "#!")
}
