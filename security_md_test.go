// SPDX-License-Identifier: MIT

package airlock

import (
	"os"
	"regexp"
	"testing"
)

// TestSecurityPolicy: SECURITY.md exists and gives a private way to report
// a vulnerability (an address), which README.md links.
func TestSecurityPolicy(t *testing.T) {
	b, err := os.ReadFile("SECURITY.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`\*\*[a-z]+@[a-z0-9.-]+\.[a-z]+\*\*`).Match(b) {
		t.Error("SECURITY.md gives no e-mail address for reports")
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`\(SECURITY\.md\)`).Match(readme) {
		t.Error("README.md does not link SECURITY.md")
	}
}
