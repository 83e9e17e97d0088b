// SPDX-License-Identifier: MIT

package kernel

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// expose adds, for each exposure of job j, a prerouting DNAT rule that
// sends TCP or UDP arriving (not from the TUN) for the public address on
// the public port to the job's address of that family and its port
// (exposeRules); the forward chain lets destination-NATed connections into
// the TUN (`ct status dnat`), and their replies are established. Exposing
// a job again replaces its rules.
func (f *Forwarder) expose(j forward.Job) error {
	exprs, err := f.rules.exposeRules(j, j.Exposures)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	kj, ok := f.jobs[j.ID]
	if !ok {
		return fmt.Errorf("kernel egress: expose %s: %w", j.ID, forward.ErrUnknownJob)
	}
	t := table()
	pre := chainsOf(t).pre
	tag := exposeTag(j.ID)
	for _, e := range exprs {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: e, UserData: tag})
	}
	for _, r := range kj.exposed {
		if err := f.nft.DelRule(r); err != nil {
			return err
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: add dnat rules for %s: %w", j.ID, err)
	}
	if kj.exposed, err = f.taggedLocked(pre, tag); err != nil {
		return err
	}
	for _, x := range j.Exposures {
		at := x.PublicAddr
		if at.IsUnspecified() {
			at = f.rules.egress[famOf(at).Index]
		}
		f.log.Info("kernel egress: exposed", "job", j.ID, "proto", x.Proto, "job_port", x.JobPort, "public", netip.AddrPortFrom(at, x.PublicPort))
	}
	return nil
}

// unexpose deletes the DNAT rules of job id and the conntrack entries of
// the connections they carried.
func (f *Forwarder) unexpose(id jobs.ID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	kj, ok := f.jobs[id]
	if !ok || f.closed || len(kj.exposed) == 0 {
		return
	}
	for _, r := range kj.exposed {
		if err := f.nft.DelRule(r); err != nil {
			f.log.Error("kernel egress: delete dnat rule", "job", id, "err", err)
		}
	}
	kj.exposed = nil
	if err := f.nft.Flush(); err != nil {
		f.log.Error("kernel egress: delete dnat rules", "job", id, "err", err)
	}
	for _, a := range kj.addrs {
		filter := &netlink.ConntrackFilter{}
		if err := filter.AddIP(netlink.ConntrackReplySrcIP, a.AsSlice()); err != nil {
			return
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, famOf(a).netlink, filter); err != nil {
			f.log.Warn("kernel egress: cannot flush the job's inbound conntrack entries", "job", a, "err", err)
		}
	}
}
