// SPDX-License-Identifier: MIT

package nsexec

import (
	"net/netip"
	"strings"
	"testing"
)

// TestGaiConf: the job's gai.conf keeps glibc's whole default label table
// (any label line replaces it) and gives the tunnel prefix the label of
// ::/0.
func TestGaiConf(t *testing.T) {
	got := gaiConfFor(netip.MustParsePrefix("fd12:3456:789a::6440:2/48"))
	for _, want := range []string{
		"label ::1/128       0\n", "label ::/0          1\n", "label ::ffff:0:0/96 4\n",
		"label fc00::/7      6\n", "label fd12:3456:789a::/48 1\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("gai.conf lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\nlabel "); n != 9 {
		t.Errorf("gai.conf has %d label lines, want 9 (glibc's 8 and the prefix):\n%s", n, got)
	}
}
