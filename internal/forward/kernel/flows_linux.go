// SPDX-License-Identifier: MIT

package kernel

// Flow accounting in kernel mode. Jobs' packets are forwarded by the host,
// so the gateway learns about flows from conntrack: with
// net.netfilter.nf_conntrack_acct on (New switches it on in the gateway's
// network namespace and restores it at Close), every conntrack entry
// carries packet and byte counters per direction. A poller dumps the
// conntrack table every acctPoll over netlink (vishvananda/netlink) and
// feeds the flow table:
//
//   - an entry whose original source is a job's tunnel address is an
//     egress flow; one whose reply source is a job's (DNAT of an exposed
//     port) is an inbound flow. Entries towards the gateway's own tunnel
//     address (DNS relay, ping) are not flows: the gateway answers them.
//   - the first dump that shows an entry opens its flow; each dump sets its
//     absolute counters (original direction = what the job sent for egress
//     flows, the reverse for inbound ones); bytes are IP bytes, headers
//     included, and packets are packets as the host's forwarding path
//     handled them (a GRO-merged packet counts once).
//   - a TCP entry in TIME_WAIT or CLOSE ends its flow; an entry that is
//     gone from the dump (timed out, or flushed by RemoveJob) ends it with
//     the counters of the last dump; an entry whose counters went down is a
//     new flow on the same 5-tuple.
//   - the flow table's idle timeout ends a flow by deleting its conntrack
//     entry; its next packet then starts a new flow.
//
// A flow shorter than one poll that conntrack forgets within the same poll
// is missed; TCP entries linger in TIME_WAIT (120 s) and UDP/ICMP entries
// at least 30 s, so in practice only flows flushed by RemoveJob between two
// polls could be, and RemoveJob polls once before it flushes.
//
// Refusals happen inside nftables, which reports counts only (the block,
// flow and new-flow-rate limit rules' counters, and the policy rules',
// Stats.PolicyDrops): they are added to the flow table's verdict counts with
// CountRefused, without per-flow records.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/ipproto"
)

const (
	// acctPoll is how often the conntrack table is read.
	acctPoll = time.Second
	// conntrackAcctPath switches conntrack's per-entry counters on.
	conntrackAcctPath = "/proc/sys/net/netfilter/nf_conntrack_acct"

	// TCP conntrack states (include/uapi/linux/netfilter/nf_conntrack_tcp.h).
	tcpConntrackTimeWait = 7
	tcpConntrackClose    = 8
)

// ctKey identifies a conntrack entry by its original tuple.
type ctKey struct {
	proto    uint8
	src, dst netip.AddrPort
}

// ctFlow is a classified conntrack entry.
type ctFlow struct {
	key              flows.Key
	dir              string
	bo, po, bi, pi   uint64 // the job's out and in counters
	closed           bool   // TCP in TIME_WAIT or CLOSE
	origSrc, origDst netip.AddrPort
	origProto        uint8
	// publicPort is an egress flow's source port after source NAT: the
	// destination port of conntrack's reply tuple.
	publicPort uint16
}

// jobNets says which addresses are jobs': the tunnel subnets, without the
// gateway's own tunnel addresses. (A job's own public IPv6 address is
// NATed to its tunnel address, which conntrack's tuples show.)
type jobNets struct {
	subnets []netip.Prefix
	gws     []netip.Addr
}

// newJobNets returns the job addresses of ruleset r.
func newJobNets(r ruleset) jobNets {
	var n jobNets
	for _, f := range r.families() {
		n.subnets = append(n.subnets, r.tunnels[f.Index].Masked())
		n.gws = append(n.gws, r.tunnels[f.Index].Addr())
	}
	return n
}

// inside reports whether a is in a tunnel subnet (a job's or a gateway's
// tunnel address).
func (n jobNets) inside(a netip.Addr) bool {
	for _, p := range n.subnets {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (n jobNets) gw(a netip.Addr) bool {
	for _, g := range n.gws {
		if g == a {
			return true
		}
	}
	return false
}

// classify maps a conntrack entry to a flow of a job, or ok false if it
// is not one (not a job's, or towards the gateway itself).
func classify(ct *netlink.ConntrackFlow, jn jobNets) (c ctFlow, ok bool) {
	osrc, ok1 := netip.AddrFromSlice(ct.Forward.SrcIP)
	odst, ok2 := netip.AddrFromSlice(ct.Forward.DstIP)
	rsrc, ok3 := netip.AddrFromSlice(ct.Reverse.SrcIP)
	if !ok1 || !ok2 || !ok3 {
		return ctFlow{}, false
	}
	osrc, odst, rsrc = osrc.Unmap(), odst.Unmap(), rsrc.Unmap()
	proto := ct.Forward.Protocol
	c.origProto = proto
	c.origSrc = netip.AddrPortFrom(osrc, ct.Forward.SrcPort)
	c.origDst = netip.AddrPortFrom(odst, ct.Forward.DstPort)
	if tcp, isTCP := ct.ProtoInfo.(*netlink.ProtoInfoTCP); isTCP {
		c.closed = tcp.State == tcpConntrackTimeWait || tcp.State == tcpConntrackClose
	}
	switch {
	case jn.inside(osrc) && !jn.gw(osrc):
		if jn.gw(odst) || jn.inside(odst) {
			return ctFlow{}, false
		}
		c.dir = flows.Egress
		c.key = flows.Key{Proto: ipproto.Proto(proto), Src: c.origSrc, Dst: c.origDst}
		if proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP {
			c.publicPort = ct.Reverse.DstPort
		}
		c.bo, c.po, c.bi, c.pi = ct.Forward.Bytes, ct.Forward.Packets, ct.Reverse.Bytes, ct.Reverse.Packets
	case jn.inside(rsrc) && !jn.gw(rsrc) && !jn.inside(osrc):
		// DNAT to a job: the reply comes from the job's address and port.
		c.dir = flows.Inbound
		c.key = flows.Key{Proto: ipproto.Proto(proto), Src: c.origSrc, Dst: netip.AddrPortFrom(rsrc, ct.Reverse.SrcPort)}
		c.bo, c.po, c.bi, c.pi = ct.Reverse.Bytes, ct.Reverse.Packets, ct.Forward.Bytes, ct.Forward.Packets
	default:
		return ctFlow{}, false
	}
	return c, true
}

// tracked is one conntrack entry the accountant follows.
type tracked struct {
	fl   *flows.Flow // nil once ended while the entry lingers
	seen uint64      // poll generation that last saw it
}

// accountant feeds the flow table from conntrack. It is safe for
// concurrent use.
type accountant struct {
	tb *flows.Table
	jn jobNets
	fw *Forwarder

	mu      sync.Mutex
	gen     uint64
	entries map[ctKey]*tracked
	// last refusal counts reported, per verdict.
	refused map[string]uint64
	warned  bool
}

func newAccountant(tb *flows.Table, r ruleset, fw *Forwarder) *accountant {
	return &accountant{tb: tb, jn: newJobNets(r), fw: fw, entries: make(map[ctKey]*tracked), refused: make(map[string]uint64)}
}

// run polls until ctx is done, then polls once more.
func (a *accountant) run(ctx context.Context) {
	t := time.NewTicker(acctPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.poll()
			a.countRefusals()
		}
	}
}

// poll reads the conntrack table once and updates the flow table.
func (a *accountant) poll() {
	cts, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err == nil && len(a.jn.subnets) > 1 {
		var cts6 []*netlink.ConntrackFlow
		cts6, err = netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET6)
		cts = append(cts, cts6...)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if !a.warned {
			a.fw.log.Warn("kernel egress: cannot read conntrack; flows are not accounted", "err", err)
			a.warned = true
		}
		return
	}
	a.gen++
	for _, ct := range cts {
		c, ok := classify(ct, a.jn)
		if !ok {
			continue
		}
		k := ctKey{proto: c.origProto, src: c.origSrc, dst: c.origDst}
		e := a.entries[k]
		if e != nil && e.fl != nil {
			bo, bi, po, pi := e.fl.Counters()
			if c.bo < bo || c.bi < bi || c.po < po || c.pi < pi {
				// A new entry on the same tuple.
				e.fl.End(flows.EndClosed)
				e = nil
			}
		}
		if e == nil {
			if c.closed {
				// Seen first in TIME_WAIT: ended between polls.
				e = &tracked{}
				fl := a.tb.Open(c.key, c.dir)
				fl.SetPublicPort(c.publicPort)
				fl.Set(c.bo, c.po, c.bi, c.pi)
				fl.End(flows.EndClosed)
				a.entries[k] = e
			} else {
				e = &tracked{fl: a.tb.Open(c.key, c.dir)}
				e.fl.SetCloser(entryCloser{k: k, log: a.fw})
				e.fl.SetPublicPort(c.publicPort)
				a.entries[k] = e
			}
		}
		e.seen = a.gen
		if e.fl != nil {
			e.fl.Set(c.bo, c.po, c.bi, c.pi)
			if c.closed || e.fl.Ended() {
				e.fl.End(flows.EndClosed)
				e.fl = nil
			}
		}
	}
	for k, e := range a.entries {
		if e.seen != a.gen {
			e.fl.End(flows.EndClosed)
			delete(a.entries, k)
		}
	}
}

// endJob ends the flows of the job at addr with flows.EndJob.
func (a *accountant) endJob(addr netip.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, e := range a.entries {
		if e.fl != nil && (k.src.Addr() == addr || e.fl.Key().Dst.Addr() == addr) {
			e.fl.End(flows.EndJob)
			e.fl = nil
		}
	}
}

// countRefusals adds the nftables refusal counters' growth to the flow
// table's verdict counts.
func (a *accountant) countRefusals() {
	got := map[string]uint64{}
	if n, err := a.fw.blockRefusals(); err == nil {
		got[flows.BlockExhausted] = n
	}
	if ls, err := a.fw.limitStats(); err == nil {
		got[flows.FlowLimit] = ls.FlowsRefused
		got[flows.NewFlowRate] = ls.RateRefused
	}
	if pd, err := a.fw.policyDrops(); err == nil {
		for rule, n := range pd {
			got[flows.Denied(rule)] = n
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for v, n := range got {
		if n > a.refused[v] {
			a.tb.CountRefused(v, n-a.refused[v])
			a.refused[v] = n
		}
	}
}

// entryCloser deletes one conntrack entry (the flow table's idle timeout).
type entryCloser struct {
	k   ctKey
	log *Forwarder
}

func (c entryCloser) Close() error {
	fl := &netlink.ConntrackFilter{}
	if err := errors.Join(
		fl.AddProtocol(c.k.proto),
		fl.AddIP(netlink.ConntrackOrigSrcIP, net.IP(c.k.src.Addr().AsSlice())),
		fl.AddIP(netlink.ConntrackOrigDstIP, net.IP(c.k.dst.Addr().AsSlice())),
	); err != nil {
		return err
	}
	if c.k.proto == unix.IPPROTO_TCP || c.k.proto == unix.IPPROTO_UDP {
		if err := errors.Join(
			fl.AddPort(netlink.ConntrackOrigSrcPort, c.k.src.Port()),
			fl.AddPort(netlink.ConntrackOrigDstPort, c.k.dst.Port()),
		); err != nil {
			return err
		}
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, famOf(c.k.src.Addr()).netlink, fl); err != nil {
		c.log.log.Debug("kernel egress: delete idle conntrack entry", "err", err)
		return err
	}
	return nil
}

// enableConntrackAcct switches conntrack accounting on and returns the
// value to restore ("" if it was on already).
func enableConntrackAcct() (string, error) {
	old, err := readSysctl(conntrackAcctPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", errors.New("no " + conntrackAcctPath + " (nf_conntrack not loaded?)")
		}
		return "", err
	}
	if old == "1" {
		return "", nil
	}
	if err := writeSysctl(conntrackAcctPath, "1"); err != nil {
		return "", err
	}
	return old, nil
}
