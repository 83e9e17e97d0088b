// SPDX-License-Identifier: MIT

package client

import (
	"runtime/debug"
	"testing"
)

// TestPauseGC checks that the collector is off, with a heap ceiling,
// between pauseGC and its resume, and as configured before and after.
func TestPauseGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(75))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(1 << 40))
	resume := pauseGC()
	if pct := debug.SetGCPercent(-1); pct != -1 {
		t.Errorf("GOGC while paused: got %d, want -1 (off)", pct)
	}
	if limit := debug.SetMemoryLimit(-1); limit != startupHeapLimit {
		t.Errorf("memory limit while paused: got %d, want %d", limit, startupHeapLimit)
	}
	resume()
	resume() // idempotent
	if pct := debug.SetGCPercent(75); pct != 75 {
		t.Errorf("GOGC after resume: got %d, want 75", pct)
	}
	if limit := debug.SetMemoryLimit(-1); limit != 1<<40 {
		t.Errorf("memory limit after resume: got %d, want %d", limit, int64(1<<40))
	}
	// A lower limit of the user's stays while paused.
	debug.SetMemoryLimit(64 << 20)
	resume = pauseGC()
	if limit := debug.SetMemoryLimit(-1); limit != 64<<20 {
		t.Errorf("the user's lower memory limit while paused: got %d, want %d", limit, 64<<20)
	}
	resume()
}
