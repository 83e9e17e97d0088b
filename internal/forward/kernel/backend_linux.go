// SPDX-License-Identifier: MIT

package kernel

import (
	"context"
	"errors"
	"time"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// AddJob implements forward.Backend (forward.Jobs: checks, index, flow
// table, one undo path) with kernel mode's steps: the job's SNAT rules
// into its port blocks and its token's policy scope (addJob), its flow
// limits and shaping (SetJobLimits), its DNAT rules for exposures
// (expose), and removeJob.
func (f *Forwarder) AddJob(j forward.Job) error { return f.reg.Add(j) }

// RemoveJob implements forward.Backend: it deletes the job's DNAT, SNAT
// and limit rules, its policy scope and conntrack entries, and ends its
// flows in the flow table.
func (f *Forwarder) RemoveJob(id jobs.ID) { f.reg.Remove(id) }

// jobSteps are kernel mode's steps of AddJob and RemoveJob.
func (f *Forwarder) jobSteps() forward.JobSteps {
	return forward.JobSteps{
		Add:       f.addJob,
		SetLimits: f.SetJobLimits,
		Expose:    f.expose,
		Remove:    f.removeJob,
	}
}

// addJob is AddJob's first step: kernel mode's checks, the NAT rules and
// the token's scope sets.
func (f *Forwarder) addJob(j forward.Job) error {
	if err := f.rules.checkJob(j); err != nil {
		return err
	}
	if err := f.addNAT(j); err != nil {
		return err
	}
	return f.setJobToken(j.ID)
}

// removeJob undoes addJob, SetJobLimits and expose; it is harmless for
// parts that were never added.
func (f *Forwarder) removeJob(j forward.Job) {
	f.unexpose(j.ID)
	f.removeNAT(j)
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
