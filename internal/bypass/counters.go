// SPDX-License-Identifier: MIT

package bypass

import (
	"net"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/airlock-vpn/airlock/internal/control"
)

// Counters count bypassed flows and payload bytes per entry name, since
// the job started. It is safe for concurrent use; the zero value is
// ready.
type Counters struct {
	mu sync.Mutex
	m  map[string]*count // guarded by mu; entries are never removed
}

type count struct {
	flows, out, in atomic.Uint64
}

// rule returns the counters of entry name, creating them.
func (c *Counters) rule(name string) *count {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]*count)
	}
	n, ok := c.m[name]
	if !ok {
		n = new(count)
		c.m[name] = n
	}
	return n
}

// Snapshot returns every entry's counters, by name.
func (c *Counters) Snapshot() []control.BypassCount {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]control.BypassCount, 0, len(c.m))
	for name, n := range c.m {
		out = append(out, control.BypassCount{Rule: name, Flows: n.flows.Load(), BytesOut: n.out.Load(), BytesIn: n.in.Load()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rule < out[j].Rule })
	return out
}

// countConn counts what passes through a bypassed flow's host socket:
// written is what the job sent (out), read what it receives (in).
type countConn struct {
	net.Conn
	n *count
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.in.Add(uint64(n))
	return n, err
}

func (c *countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.out.Add(uint64(n))
	return n, err
}

// CloseWrite half-closes a TCP flow.
func (c *countConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
