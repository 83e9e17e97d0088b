package kernel

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/airlock-vpn/airlock/internal/forward"
)

// Expose implements forward.Exposer: for each exposure a prerouting DNAT
// rule sends TCP or UDP that arrives (not from the TUN) for the egress
// address on the public port to the job's address and port; the forward
// chain lets destination-NATed connections into the TUN (`ct status dnat`),
// and their replies are established. A job with an IPv6 address is
// exposed over IPv6 too (exposeRules6): at the same public port of the
// gateway's IPv6 egress address, or at its own port of its own address.
// Exposing a job again replaces its rules.
func (f *Forwarder) Expose(job netip.Addr, ex []forward.Exposure) error {
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
		return errors.New("kernel egress: closed")
	}
	t := table()
	pre := preChain(t)
	_, inbound := chains6(t)
	tag := exposeTag(job)
	var in6 [][]expr.Any
	if j6, ok := f.jobs6[job]; ok {
		dnat6, inb, err := f.rules.exposeRules6(j6.addr, j6.egress, ex)
		if err != nil {
			return err
		}
		exprs, in6 = append(exprs, dnat6...), inb
	}
	for _, e := range exprs {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: e, UserData: tag})
	}
	for _, e := range in6 {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: inbound, Exprs: e, UserData: tag})
	}
	for _, r := range f.exposed[job] {
		if err := f.nft.DelRule(r); err != nil {
			return err
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: add dnat rules for %v: %w", job, err)
	}
	var mine []*nftables.Rule
	for _, ch := range []*nftables.Chain{pre, inbound} {
		rules, err := f.nft.GetRules(t, ch)
		if err != nil {
			return fmt.Errorf("kernel egress: list %s rules: %w", ch.Name, err)
		}
		for _, r := range rules {
			if bytes.Equal(r.UserData, tag) {
				mine = append(mine, r)
			}
		}
	}
	f.exposed[job] = mine
	for _, x := range ex {
		f.log.Info("kernel egress: exposed", "job", job, "proto", x.Proto, "job_port", x.JobPort,
			"public", netip.AddrPortFrom(cmp.Or(x.PublicAddr, f.rules.egress), x.PublicPort))
		if j6, ok := f.jobs6[job]; ok {
			at, port := f.rules.egress6, x.PublicPort
			if j6.own() {
				at, port = j6.egress, x.JobPort
			}
			f.log.Info("kernel egress: exposed over IPv6", "job", job, "proto", x.Proto, "job_port", x.JobPort, "public", netip.AddrPortFrom(at, port))
		}
	}
	return nil
}

// Unexpose implements forward.Exposer: it deletes the job's DNAT rules
// and the conntrack entries of the connections they carried.
func (f *Forwarder) Unexpose(job netip.Addr) {
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
