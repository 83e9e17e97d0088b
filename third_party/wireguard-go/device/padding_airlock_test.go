// SPDX-License-Identifier: MIT

package device

import "testing"

// TestPaddingAboveMTU checks that a packet above the device's MTU is not
// padded (airlock.patch): the gateway's device keeps the MTU every path
// carries, and a larger packet is exactly as large as its peer's path
// allows.
func TestPaddingAboveMTU(t *testing.T) {
	for _, tt := range []struct{ size, mtu, want int }{
		{1400, 1420, 8},
		{1401, 1420, 7},
		{1408, 1420, 0},
		{1419, 1420, 1}, // capped at the MTU
		{1420, 1420, 0},
		{8940, 1420, 0}, // upstream: 8940 % 1420 = 420, padded by 12
		{1421, 1420, 0},
		{100, 0, 12},
	} {
		if got := calculatePaddingSize(tt.size, tt.mtu); got != tt.want {
			t.Errorf("calculatePaddingSize(%d, %d) = %d, want %d", tt.size, tt.mtu, got, tt.want)
		}
	}
}
