// SPDX-License-Identifier: MIT

package kernel

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// AddJob implements forward.Backend: the job's SNAT rules into its port
// block, its IPv6 side (Addr6: its IPv6 NAT rules from Egress6 and
// Block6), its token's policy scope, its flow limits and shaping, its DNAT
// rules for exposures, and its entry in the flow table; if any part fails,
// everything done so far is undone.
func (f *Forwarder) AddJob(j forward.Job) error {
	addr := j.Addr
	if err := f.checkJob(j); err != nil {
		return fmt.Errorf("kernel egress: add job %v: %w", addr, err)
	}
	f.jobMu.Lock()
	defer f.jobMu.Unlock()
	f.mu.Lock()
	_, exists := f.jobs[addr]
	f.mu.Unlock()
	if exists {
		return fmt.Errorf("kernel egress: add job %v: %w", addr, forward.ErrJobExists)
	}
	if err := f.addJob(addr, j.Egress, j.Block); err != nil {
		return err
	}
	var err error
	if j.Addr6.IsValid() {
		// Before the token, limits and exposures: they cover the
		// job's IPv6 address too.
		err = f.addJob6(addr, j.Addr6, j.Egress6, j.Block6)
	}
	if err == nil {
		err = f.setJobToken(addr, j.Token)
	}
	if err == nil && f.flows != nil {
		f.flows.AddJob(addr, j.Ref)
		if j.Addr6.IsValid() {
			f.flows.AddJobAlias(j.Addr6, addr)
		}
	}
	if err == nil && !j.Limits.IsZero() {
		err = f.SetJobLimits(addr, j.Limits)
	}
	if err == nil && len(j.Exposures) > 0 {
		err = f.expose(addr, j.Exposures)
	}
	if err != nil {
		f.removeJobLocked(addr)
		return fmt.Errorf("kernel egress: add job %v: %w", addr, err)
	}
	return nil
}

// checkJob rejects what AddJob cannot take before anything is changed.
func (f *Forwarder) checkJob(j forward.Job) error {
	if !j.Addr.Is4() || !f.rules.addr.Contains(j.Addr) || j.Addr == f.rules.addr.Addr() {
		return fmt.Errorf("job address %v: want a host address of the tunnel subnet %v other than the gateway's", j.Addr, f.rules.addr.Masked())
	}
	if (j.Addr6.IsValid() || j.Egress6.IsValid()) && !f.rules.v6() {
		return fmt.Errorf("ipv6 tunnel address %v, egress %v: the gateway has no IPv6 tunnel address: %w", j.Addr6, j.Egress6, forward.ErrNotSupported)
	}
	if (j.Egress6.IsValid() || j.Block6 != (portblock.Range{})) && !j.Addr6.IsValid() {
		return fmt.Errorf("ipv6 egress address %v, block %v without an ipv6 tunnel address", j.Egress6, j.Block6)
	}
	if j.Egress.IsValid() && (!j.Egress.Is4() || j.Egress.IsUnspecified()) {
		return fmt.Errorf("egress address %v: want a unicast IPv4 address", j.Egress)
	}
	if j.Addr6.IsValid() {
		if err := f.rules.checkJob6(j.Addr, j.Addr6, j.Egress6, j.Block6); err != nil {
			return err
		}
	}
	return j.Limits.Validate()
}

// RemoveJob implements forward.Backend: it deletes the job's DNAT, SNAT
// and limit rules, its policy scope and conntrack entries, and ends its
// flows in the flow table.
func (f *Forwarder) RemoveJob(addr netip.Addr) {
	f.jobMu.Lock()
	defer f.jobMu.Unlock()
	f.removeJobLocked(addr)
}

// removeJobLocked undoes AddJob; it is harmless for parts that were never
// added. jobMu is held.
func (f *Forwarder) removeJobLocked(addr netip.Addr) {
	f.unexpose(addr)
	f.removeJob(addr)
	if f.flows != nil {
		f.flows.CloseJob(addr, flows.EndJob)
		f.flows.RemoveJob(addr)
	}
}

// Stats implements forward.Backend, from the nftables counters and the
// shapers' queue drops.
func (f *Forwarder) Stats() (forward.Stats, error) {
	var st forward.Stats
	var err error
	if st.Limits, err = f.limitStats(); err != nil {
		return st, err
	}
	if st.PolicyDrops, err = f.policyDrops(); err != nil {
		return st, err
	}
	st.BlockRefusals, err = f.blockRefusals()
	return st, err
}

// errClosed is returned by the methods of a closed Forwarder.
var errClosed = errors.New("kernel egress: closed")

// refusalPoll is how often refusalLoop reads the block limit's counters.
const refusalPoll = 2 * time.Second

// startRefusalLog starts refusalLoop; Close stops it.
func (f *Forwarder) startRefusalLog() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.refusalLoop(ctx)
	}()
	f.stopRefusals = func() {
		cancel()
		<-done
	}
}

// refusalLoop logs when the block limit has refused new flows because a
// job's port block had no port left for the destination: at most one line
// per poll, with the number refused since the last one. The refusals
// happen in the kernel, so only their count can be read.
func (f *Forwarder) refusalLoop(ctx context.Context) {
	t := time.NewTicker(refusalPoll)
	defer t.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := f.blockRefusals()
		if err != nil {
			if !errors.Is(err, errClosed) {
				f.log.Debug("read port block refusals", "err", err)
			}
			continue
		}
		if n > last {
			f.log.Warn("port block exhausted: new flows refused because a job already uses every port of its block towards that destination",
				"refused", n-last, "total", n, "block_size", f.blockSize)
			last = n
		}
	}
}
