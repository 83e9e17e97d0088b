// SPDX-License-Identifier: MIT

package airlock

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxTestSleeps is the number of lines of test files (outside
// third_party) that call time.Sleep (issue 35: 174 → ≤ 100). It only goes
// down: a test waits on what it waits for (a channel, a readiness signal,
// topology.Poll on a condition), and sleeps only where the time itself is
// the point (a TTL, a rate limiter's refill, "nothing happens for X").
// When you remove sleeps, lower it to the count this test prints.
const maxTestSleeps = 79

// TestSleepsInTests fails when more lines of test files call time.Sleep
// than maxTestSleeps, listing the count of each file.
func TestSleepsInTests(t *testing.T) {
	needle := []byte("time." + "Sleep(") // not a match of this file
	counts := map[string]int{}
	total := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == ".git" || p == "third_party" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for line := range bytes.Lines(b) {
			if bytes.Contains(line, needle) {
				counts[p]++
				total++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 {
		t.Fatal("no time.Sleep in any test file: is the walk broken?")
	}
	if total > maxTestSleeps {
		files := make([]string, 0, len(counts))
		for f := range counts {
			files = append(files, f)
		}
		slices.SortFunc(files, func(a, b string) int {
			if c := counts[b] - counts[a]; c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
		var sb strings.Builder
		for _, f := range files {
			fmt.Fprintf(&sb, "%4d %s\n", counts[f], f)
		}
		t.Errorf("%d lines of test files call time.Sleep, want at most %d: wait on the condition instead (a channel, a readiness signal, topology.Poll); per file:\n%s",
			total, maxTestSleeps, sb.String())
	} else {
		t.Logf("%d lines of test files call time.Sleep (at most %d)", total, maxTestSleeps)
	}
}
