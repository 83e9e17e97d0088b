// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

// jobEgress is where a job's outside connections leave from: its egress
// address (zero: the Stack's EgressAddr) and port block.
type jobEgress struct {
	addr  netip.Addr
	block portblock.Range
}

// jobTable maps each job's tunnel address to its egress address and port
// block. It is safe for concurrent use; the zero value is an empty table.
type jobTable struct {
	mu     sync.RWMutex
	blocks map[netip.Addr]jobEgress
}

func (t *jobTable) set(a netip.Addr, e jobEgress) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.blocks == nil {
		t.blocks = make(map[netip.Addr]jobEgress)
	}
	t.blocks[a] = e
}

func (t *jobTable) remove(a netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.blocks, a)
}

func (t *jobTable) lookup(a netip.Addr) (jobEgress, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e, ok := t.blocks[a]
	return e, ok
}

// addJob makes the outside connections of the job at addr leave from egress
// (zero: EgressAddr) and ports of block (a zero block: any port) from now
// on (AddJob, backend.go).
func (s *Stack) addJob(addr, egress netip.Addr, block portblock.Range) error {
	if block != (portblock.Range{}) && block.Lo > block.Hi {
		return fmt.Errorf("add job %s: bad port block %s", addr, block)
	}
	if egress.IsValid() && egress.IsMulticast() {
		return fmt.Errorf("add job %s: bad egress address %s", addr, egress)
	}
	if egress.IsValid() && egress.IsUnspecified() {
		egress = netip.Addr{} // the kernel's choice per destination
	}
	s.jobs.set(addr.Unmap(), jobEgress{addr: egress.Unmap(), block: block})
	s.limits.add(addr.Unmap())
	return nil
}

// removeJob forgets the job's egress, limits, token and DNS state and
// closes its ICMP echo flows; its TCP and UDP flows already open keep
// running until they end (RemoveJob, backend.go, ends them), still under
// the job's bandwidth limits.
func (s *Stack) removeJob(addr netip.Addr) {
	s.jobs.remove(addr.Unmap())
	s.limits.remove(addr.Unmap())
	s.pings.removeJob(addr.Unmap())
	s.pol.forget(addr.Unmap())
	s.dns.RemoveJob(addr)
	s.removeJob6(addr.Unmap())
}

// dial opens the host socket for a job's flow from src to dst: through the
// Dial hook if one is configured, else from a port of the job's block (and
// from EgressAddr if set). A job with a block that has no free port fails at
// once with portblock.ErrExhausted, counted and logged.
func (s *Stack) dial(ctx context.Context, src netip.Addr, network string, dst netip.AddrPort) (net.Conn, error) {
	if s.cfg.Dial != nil {
		return s.cfg.Dial(ctx, network, dst.String())
	}
	base := net.Dialer{Timeout: s.cfg.DialTimeout, KeepAlive: 30 * time.Second}
	je, ok := s.jobs.lookup(src)
	from := s.cfg.EgressAddr
	if je.addr.IsValid() {
		from = je.addr
	}
	block := je.block
	if !ok || block == (portblock.Range{}) {
		if from.IsValid() {
			base.LocalAddr = localAddr(network, from, 0)
			if from.Is6() {
				// A job's own IPv6 address (dualstack.go) is on no interface.
				base.Control = freebind6
			}
		}
		return base.DialContext(ctx, network, dst.String())
	}
	d := portblock.Dialer{Block: block, Base: base, LocalIP: from, Explicit: s.cfg.ExplicitPorts}
	c, err := d.DialContext(ctx, network, dst.String())
	if errors.Is(err, portblock.ErrExhausted) {
		s.stats.blockExhausted.Add(1)
		if s.flowLog.Allow() {
			s.log.Warn("job's port block exhausted: new connection refused", "job", src, "dst", dst, "block", block)
		}
	}
	return c, err
}

func localAddr(network string, ip netip.Addr, port int) net.Addr {
	switch network {
	case "udp", "udp4", "udp6":
		return &net.UDPAddr{IP: ip.AsSlice(), Port: port}
	default:
		return &net.TCPAddr{IP: ip.AsSlice(), Port: port}
	}
}
