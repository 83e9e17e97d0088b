// SPDX-License-Identifier: MIT

package gateway

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
)

func TestPlanCapacity(t *testing.T) {
	for _, tt := range []struct {
		blocks int
		subnet string
		nofile uint64
		jobs   int
		bound  string
	}{
		{blocks: 110, subnet: "100.64.0.0/16", nofile: 1 << 20, jobs: 110, bound: "egress port blocks"},
		{blocks: 0, subnet: "100.64.0.0/24", nofile: 1 << 20, jobs: 253, bound: "tunnel subnet"},
		{blocks: 4000, subnet: "100.64.0.0/22", nofile: 1 << 20, jobs: 1021, bound: "tunnel subnet"},
		{blocks: 4000, subnet: "100.64.0.0/16", nofile: 20000, jobs: (20000 - fdsReserved) / fdsPerJob, bound: "RLIMIT_NOFILE"},
		{blocks: 10, subnet: "100.64.0.0/16", nofile: 100, jobs: 0, bound: "RLIMIT_NOFILE"},
	} {
		c := planCapacity(tt.blocks, netip.MustParsePrefix(tt.subnet), tt.nofile)
		if c.Jobs != tt.jobs || !strings.Contains(c.Bound, tt.bound) || c.Hint == "" {
			t.Errorf("planCapacity(%d, %s, %d) = %d jobs bound by %q (%s), want %d by %q", tt.blocks, tt.subnet, tt.nofile, c.Jobs, c.Bound, c.Hint, tt.jobs, tt.bound)
		}
	}
}

// TestCapacityWarnsOnLowNoFile: the start-up log names the capacity and
// warns when RLIMIT_NOFILE cannot hold the port blocks' jobs.
func TestCapacityWarnsOnLowNoFile(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	planCapacity(4000, netip.MustParsePrefix("100.64.0.0/16"), 1024).log(log)
	out := buf.String()
	for _, want := range []string{"capacity: 96 concurrent jobs, bound by file descriptors", "level=WARN", "RLIMIT_NOFILE is too low"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q: %s", want, out)
		}
	}
	buf.Reset()
	planCapacity(100, netip.MustParsePrefix("100.64.0.0/16"), 1<<20).log(log)
	if strings.Contains(buf.String(), "WARN") {
		t.Errorf("warned with a high limit: %s", buf.String())
	}
}
