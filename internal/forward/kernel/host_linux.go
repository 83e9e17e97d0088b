// SPDX-License-Identifier: MIT

package kernel

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/forward"
)

// checkJob is kernel mode's part of checking a Job (forward.Jobs checks
// the rest): an own egress address must be in the routed prefix of own
// addresses (--egress-prefix), and an address of that prefix is an own
// one.
func (r ruleset) checkJob(j forward.Job) error {
	for _, e := range j.Egress {
		inOwn := r.own.IsValid() && r.own.Contains(e.Addr)
		switch {
		case e.Own && !inOwn:
			return fmt.Errorf("own egress address %v: not in the routed prefix of own addresses (--egress-prefix %v)", e.Addr, r.own)
		case !e.Own && inOwn:
			return fmt.Errorf("egress address %v is in the prefix of own addresses %v: only a job's own address may be", e.Addr, r.own)
		}
	}
	return nil
}

// warnAcceptRA warns when switching IPv6 forwarding on will make the host
// ignore router advertisements that its default IPv6 route may come from
// (accept_ra=1 means "only when not forwarding").
func warnAcceptRA(log *slog.Logger) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return
	}
	for _, r := range routes {
		if r.Protocol != unix.RTPROT_RA {
			continue
		}
		link, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		name := link.Attrs().Name
		if v, err := readSysctl("/proc/sys/net/ipv6/conf/" + name + "/accept_ra"); err == nil && v == "1" {
			log.Warn("kernel egress: switching IPv6 forwarding on makes the host ignore router advertisements on "+name+
				", which its IPv6 routes come from; when they expire IPv6 egress stops. Set net.ipv6.conf."+name+".accept_ra=2 (or configure the routes statically)",
				"link", name)
			return
		}
	}
}

// CheckPrefix6 checks the host's side of a routed --egress-prefix and
// returns what is missing, with the fix, as sentences (none if the setup
// looks right). The site's router must send the prefix to this host (which
// no check here can see); on this host the prefix must not be on-link on
// another interface, or the jobs' addresses would be looked up there by
// neighbour discovery instead of being routed to the TUN, nor a local
// route (user mode's setup), which would deliver packets for them to the
// host's own sockets.
func CheckPrefix6(prefix netip.Prefix, tun string) []string {
	var out []string
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return []string{fmt.Sprintf("cannot list IPv6 routes to check --egress-prefix %v: %v", prefix, err)}
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		dst := netip.PrefixFrom(a, ones)
		if !dst.Overlaps(prefix) || dst.Bits() == 0 {
			continue
		}
		link, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil || link.Attrs().Name == tun {
			continue
		}
		if dst.Bits() <= prefix.Bits() && r.Gw == nil {
			out = append(out, fmt.Sprintf("--egress-prefix %v is on-link on %s (route %v): the router there finds jobs' addresses by neighbour discovery, which this host does not answer for them. "+
				"Fix: have the site route %v to this host's address (e.g. on the router: ip -6 route add %v via HOST_ADDRESS) and take it off %s, "+
				"or answer for it with an NDP proxy (sysctl net.ipv6.conf.%s.proxy_ndp=1 and ip -6 neigh add proxy ADDRESS dev %s for each job address)",
				prefix, link.Attrs().Name, dst, prefix, prefix, link.Attrs().Name, link.Attrs().Name, link.Attrs().Name))
		}
	}
	if local, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_LOCAL}, netlink.RT_FILTER_TABLE); err == nil {
		for _, r := range local {
			if r.Dst == nil || r.Type != unix.RTN_LOCAL {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			if a, ok := netip.AddrFromSlice(r.Dst.IP); ok && ones < 128 && netip.PrefixFrom(a, ones).Overlaps(prefix) {
				out = append(out, fmt.Sprintf("a local route for %s (user mode's setup for --egress-prefix) hands unsolicited packets for jobs' own addresses to this host's sockets. Fix: ip -6 route del local %s dev lo",
					netip.PrefixFrom(a, ones), netip.PrefixFrom(a, ones)))
			}
		}
	}
	if v, err := readSysctl("/proc/sys/net/ipv6/conf/all/disable_ipv6"); err == nil && v == "1" {
		out = append(out, "IPv6 is disabled on this host (net.ipv6.conf.all.disable_ipv6=1). Fix: sysctl -w net.ipv6.conf.all.disable_ipv6=0")
	}
	return out
}

// startDNS starts the DNS relay on the gateway's tunnel address gw, port
// 53, on host sockets, admitting queries against lim.
func startDNS(cfg Config, gw netip.Addr, upstreams []netip.AddrPort, lim *dnsfwd.Limiter) (*dnsfwd.Server, error) {
	at := netip.AddrPortFrom(gw, 53).String()
	pc, err := net.ListenPacket("udp", at)
	if err != nil {
		return nil, privError("kernel egress: dns relay on the tunnel address "+gw.String(), err)
	}
	ln, err := net.Listen("tcp", at)
	if err != nil {
		pc.Close()
		return nil, privError("kernel egress: dns relay on the tunnel address "+gw.String(), err)
	}
	s, err := dnsfwd.Start(dnsfwd.Config{Logger: cfg.Logger.With("component", "dns", "addr", gw), Upstreams: upstreams, Flows: cfg.Flows, Limiter: lim}, pc, ln)
	if err != nil {
		return nil, fmt.Errorf("kernel egress: %w", err)
	}
	return s, nil
}
