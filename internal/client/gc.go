// SPDX-License-Identifier: MIT

package client

import (
	"runtime/debug"
	"sync"
)

// startupHeapLimit bounds the heap while the collector is paused for the
// start-up (pauseGC): the Go runtime collects when the heap nears it
// however long the start-up waits (a busy gateway is waited for up to
// --join-timeout).
const startupHeapLimit = 256 << 20

// pauseGC turns the garbage collector off for airlock run's start-up
// (with startupHeapLimit as a ceiling, or the user's GOMEMLIMIT if lower)
// and returns the function that puts back what was set before (GOGC,
// GOMEMLIMIT); it may be called any number of times. The start-up
// allocates about 20 MB of heap within a few milliseconds (the join's
// TLS; most of it as the WireGuard device starts, its batch buffers of
// 64 KiB messages), which made the collector run three times on the way
// to the job's start (GODEBUG=gctrace=1): `airlock run -- true` took a
// median of 52.1 ms with it and 46.3 ms with GOGC=off, 20 runs each
// interleaved at load 2.1. The job's own life runs with the collector as
// configured.
func pauseGC() (resume func()) {
	pct := debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(-1) // reads it
	if limit > startupHeapLimit {
		debug.SetMemoryLimit(startupHeapLimit)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			debug.SetMemoryLimit(limit)
			debug.SetGCPercent(pct)
		})
	}
}
