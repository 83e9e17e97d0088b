package kernel

import (
	"bytes"
	"cmp"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/forward"
)

// expose adds, for each exposure a prerouting DNAT
// rule sends TCP or UDP that arrives (not from the TUN) for the egress
// address on the public port to the job's address and port; the forward
// chain lets destination-NATed connections into the TUN (`ct status dnat`),
// and their replies are established. Exposing a job again replaces its
// rules.
func (f *Forwarder) expose(job netip.Addr, ex []forward.Exposure) error {
	if !job.Is4() || !f.rules.addr.Contains(job) {
		return fmt.Errorf("kernel egress: job address %v outside the tunnel subnet %v", job, f.rules.addr.Masked())
	}
	exprs, err := f.rules.exposeRules(job, ex)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
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
	rules, err := f.nft.GetRules(t, pre)
	if err != nil {
		return fmt.Errorf("kernel egress: list dnat rules: %w", err)
	}
	var mine []*nftables.Rule
	for _, r := range rules {
		if bytes.Equal(r.UserData, tag) {
			mine = append(mine, r)
		}
	}
	f.exposed[job] = mine
	for _, x := range ex {
		f.log.Info("kernel egress: exposed", "job", job, "proto", x.Proto, "job_port", x.JobPort,
			"public", netip.AddrPortFrom(cmp.Or(x.PublicAddr, f.rules.egress), x.PublicPort))
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
	filter := &netlink.ConntrackFilter{}
	if err := filter.AddIP(netlink.ConntrackReplySrcIP, job.AsSlice()); err != nil {
		return
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, filter); err != nil {
		f.log.Warn("kernel egress: cannot flush the job's inbound conntrack entries", "job", job, "err", err)
	}
}
