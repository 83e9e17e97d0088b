// SPDX-License-Identifier: MIT

package kernel

import (
	"cmp"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/airlock-vpn/airlock/internal/forward"
)

// expose adds, for each exposure, a prerouting DNAT rule that sends TCP or
// UDP arriving (not from the TUN) for the public address on the public
// port to the job's address and port; the forward chain lets
// destination-NATed connections into the TUN (`ct status dnat`), and their
// replies are established. An exposure whose PublicAddr is IPv6 goes to
// the job's IPv6 address (AddJob adds it first; exposeRules6), at the
// job's own port if that is the job's own address. Exposing a job again
// replaces its rules.
func (f *Forwarder) expose(job netip.Addr, ex []forward.Exposure) error {
	if !job.Is4() || !f.rules.addr.Contains(job) {
		return fmt.Errorf("kernel egress: job address %v outside the tunnel subnet %v", job, f.rules.addr.Masked())
	}
	var ex4, ex6 []forward.Exposure
	for _, x := range ex {
		if x.PublicAddr.Is6() && !x.PublicAddr.Is4In6() {
			ex6 = append(ex6, x)
		} else {
			ex4 = append(ex4, x)
		}
	}
	exprs, err := f.rules.exposeRules(job, ex4)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	j6, has6 := f.jobs6[job]
	if len(ex6) > 0 {
		if !has6 {
			return fmt.Errorf("kernel egress: expose %v over IPv6: the job has no IPv6 address", job)
		}
		dnat6, err := f.rules.exposeRules6(j6.addr, j6.own(), ex6)
		if err != nil {
			return err
		}
		exprs = append(exprs, dnat6...)
	}
	t := table()
	pre := preChain(t)
	tag := exposeTag(job)
	for _, e := range exprs {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: e, UserData: tag})
	}
	for _, r := range f.exposed[job] {
		if err := f.nft.DelRule(r); err != nil {
			return err
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: add dnat rules for %v: %w", job, err)
	}
	mine, err := f.taggedLocked(pre, tag)
	if err != nil {
		return err
	}
	f.exposed[job] = mine
	for _, x := range ex {
		at, port := cmp.Or(x.PublicAddr, f.rules.egress), x.PublicPort
		if x.PublicAddr.Is6() && j6.own() {
			port = x.JobPort
		}
		f.log.Info("kernel egress: exposed", "job", job, "proto", x.Proto, "job_port", x.JobPort, "public", netip.AddrPortFrom(at, port))
	}
	return nil
}

// unexpose deletes the job's DNAT rules
// and the conntrack entries of the connections they carried.
func (f *Forwarder) unexpose(job netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, ok := f.exposed[job]
	if !ok || f.closed {
		return
	}
	delete(f.exposed, job)
	for _, r := range rules {
		if err := f.nft.DelRule(r); err != nil {
			f.log.Error("kernel egress: delete dnat rule", "job", job, "err", err)
		}
	}
	if err := f.nft.Flush(); err != nil {
		f.log.Error("kernel egress: delete dnat rules", "job", job, "err", err)
	}
	addrs := []netip.Addr{job}
	if j6, ok := f.jobs6[job]; ok {
		addrs = append(addrs, j6.addr)
	}
	for _, a := range addrs {
		filter := &netlink.ConntrackFilter{}
		if err := filter.AddIP(netlink.ConntrackReplySrcIP, a.AsSlice()); err != nil {
			return
		}
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family(a), filter); err != nil {
			f.log.Warn("kernel egress: cannot flush the job's inbound conntrack entries", "job", a, "err", err)
		}
	}
}
