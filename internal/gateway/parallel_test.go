// SPDX-License-Identifier: MIT

package gateway

import (
	"runtime"
	"strings"
	"testing"
)

// TestParallelDefaults: --udp-sockets and --tun-queues default to
// GOMAXPROCS, keep what is set, and refuse what is out of range with the
// flag's name.
func TestParallelDefaults(t *testing.T) {
	def := min(runtime.GOMAXPROCS(0), MaxParallel)
	for _, tc := range []struct {
		udp, tun         int
		wantUDP, wantTUN int
		err              string
	}{
		{0, 0, def, def, ""},
		{3, 1, 3, 1, ""},
		{MaxParallel, 0, MaxParallel, def, ""},
		{-1, 0, 0, 0, "--udp-sockets -1 out of range"},
		{0, MaxParallel + 1, 0, 0, "--tun-queues 65 out of range"},
	} {
		c := Config{UDPSockets: tc.udp, TUNQueues: tc.tun}
		err := c.setParallel()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("udp %d tun %d: got %v, want %q", tc.udp, tc.tun, err, tc.err)
			}
			continue
		}
		if err != nil || c.UDPSockets != tc.wantUDP || c.TUNQueues != tc.wantTUN {
			t.Errorf("udp %d tun %d: got %d, %d, %v; want %d, %d", tc.udp, tc.tun, c.UDPSockets, c.TUNQueues, err, tc.wantUDP, tc.wantTUN)
		}
	}
}
