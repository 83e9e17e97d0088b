// SPDX-License-Identifier: MIT

//go:build !race

package netstack

// raceEnabled is true when the race detector is on; it allocates on its own
// and so falsifies allocation counts.
const raceEnabled = false
