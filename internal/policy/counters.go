// SPDX-License-Identifier: MIT

package policy

import (
	"sync"
	"sync/atomic"
)

// Counters count flows denied, per rule name. It is safe for concurrent
// use; the zero value is ready. Names persist across policies, so that a
// reload keeps counting under the same names.
type Counters struct {
	mu sync.RWMutex
	m  map[string]*atomic.Uint64
}

// Inc counts one denied flow (or datagram) of rule.
func (c *Counters) Inc(rule string) {
	c.mu.RLock()
	n, ok := c.m[rule]
	c.mu.RUnlock()
	if !ok {
		c.mu.Lock()
		if c.m == nil {
			c.m = make(map[string]*atomic.Uint64)
		}
		if n, ok = c.m[rule]; !ok {
			n = new(atomic.Uint64)
			c.m[rule] = n
		}
		c.mu.Unlock()
	}
	n.Add(1)
}

// Snapshot returns the counts by rule name; rules that never denied
// anything are absent.
func (c *Counters) Snapshot() map[string]uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]uint64, len(c.m))
	for k, v := range c.m {
		out[k] = v.Load()
	}
	return out
}
