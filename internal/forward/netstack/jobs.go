package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

var _ forward.Jobs = (*Stack)(nil)

// jobTable maps each job's tunnel address to its egress port block. It is
// safe for concurrent use; the zero value is an empty table.
type jobTable struct {
	mu     sync.RWMutex
	blocks map[netip.Addr]portblock.Range
}

func (t *jobTable) set(a netip.Addr, r portblock.Range) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.blocks == nil {
		t.blocks = make(map[netip.Addr]portblock.Range)
	}
	t.blocks[a] = r
}

func (t *jobTable) remove(a netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.blocks, a)
}

func (t *jobTable) lookup(a netip.Addr) (portblock.Range, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	r, ok := t.blocks[a]
	return r, ok
}

// AddJob implements forward.Jobs: from now on the outside connections of the
// job at addr leave from ports of block (a zero block: any port).
func (s *Stack) AddJob(addr netip.Addr, block portblock.Range) error {
	if block != (portblock.Range{}) && block.Lo > block.Hi {
		return fmt.Errorf("add job %s: bad port block %s", addr, block)
	}
	s.jobs.set(addr.Unmap(), block)
	s.limits.add(addr.Unmap())
	return nil
}

// RemoveJob implements forward.Jobs. The job's ICMP echo flows are closed;
// its TCP and UDP flows already open keep running until they end (the
// WireGuard peer is gone, so they end soon), still under the job's
// bandwidth limits. Its limits and token are forgotten.
func (s *Stack) RemoveJob(addr netip.Addr) {
	s.jobs.remove(addr.Unmap())
	s.limits.remove(addr.Unmap())
	s.pings.removeJob(addr.Unmap())
	s.pol.forget(addr.Unmap())
	s.dns.RemoveJob(addr)
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
	block, ok := s.jobs.lookup(src)
	if !ok || block == (portblock.Range{}) {
		if s.cfg.EgressAddr.IsValid() {
			base.LocalAddr = localAddr(network, s.cfg.EgressAddr, 0)
		}
		return base.DialContext(ctx, network, dst.String())
	}
	d := portblock.Dialer{Block: block, Base: base, LocalIP: s.cfg.EgressAddr}
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
