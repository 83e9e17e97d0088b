// SPDX-License-Identifier: MIT

package kernel

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/airlock-vpn/airlock/internal/flows"
)

func TestClassify(t *testing.T) {
	subnet := netip.MustParsePrefix("100.64.0.1/16")
	subnet6 := netip.MustParsePrefix("fd00:a1::1/64")
	tuple := func(src, dst string, sp, dp uint16, proto uint8, bytes, pkts uint64) netlink.IPTuple {
		return netlink.IPTuple{SrcIP: net.ParseIP(src), DstIP: net.ParseIP(dst), SrcPort: sp, DstPort: dp, Protocol: proto, Bytes: bytes, Packets: pkts}
	}
	for _, c := range []struct {
		name           string
		ct             netlink.ConntrackFlow
		ok             bool
		dir            string
		src, dst       string
		bo, po, bi, pi uint64
		closed         bool
	}{
		{
			name: "egress tcp, snat",
			ct: netlink.ConntrackFlow{
				Forward:   tuple("100.64.0.2", "192.0.2.9", 40000, 80, 6, 500, 5),
				Reverse:   tuple("192.0.2.9", "203.0.113.1", 80, 20001, 6, 9000, 8),
				ProtoInfo: &netlink.ProtoInfoTCP{State: 3},
			},
			ok: true, dir: flows.Egress, src: "100.64.0.2:40000", dst: "192.0.2.9:80", bo: 500, po: 5, bi: 9000, pi: 8,
		},
		{
			name: "egress tcp in time_wait",
			ct: netlink.ConntrackFlow{
				Forward:   tuple("100.64.0.2", "192.0.2.9", 40000, 80, 6, 500, 5),
				Reverse:   tuple("192.0.2.9", "203.0.113.1", 80, 20001, 6, 9000, 8),
				ProtoInfo: &netlink.ProtoInfoTCP{State: tcpConntrackTimeWait},
			},
			ok: true, dir: flows.Egress, src: "100.64.0.2:40000", dst: "192.0.2.9:80", bo: 500, po: 5, bi: 9000, pi: 8, closed: true,
		},
		{
			name: "inbound udp, dnat to a job",
			ct: netlink.ConntrackFlow{
				Forward: tuple("198.51.100.3", "203.0.113.1", 5555, 20250, 17, 100, 1),
				Reverse: tuple("100.64.0.7", "198.51.100.3", 5000, 5555, 17, 300, 2),
			},
			ok: true, dir: flows.Inbound, src: "198.51.100.3:5555", dst: "100.64.0.7:5000", bo: 300, po: 2, bi: 100, pi: 1,
		},
		{
			name: "dns to the gateway itself",
			ct:   netlink.ConntrackFlow{Forward: tuple("100.64.0.2", "100.64.0.1", 3333, 53, 17, 60, 1), Reverse: tuple("100.64.0.1", "100.64.0.2", 53, 3333, 17, 90, 1)},
		},
		{
			name: "job to job",
			ct:   netlink.ConntrackFlow{Forward: tuple("100.64.0.2", "100.64.0.3", 1, 2, 6, 0, 0), Reverse: tuple("100.64.0.3", "100.64.0.2", 2, 1, 6, 0, 0)},
		},
		{
			name: "the host's own traffic",
			ct:   netlink.ConntrackFlow{Forward: tuple("203.0.113.1", "192.0.2.9", 1, 2, 6, 0, 0), Reverse: tuple("192.0.2.9", "203.0.113.1", 2, 1, 6, 0, 0)},
		},
		{
			name: "egress tcp over IPv6, snat",
			ct: netlink.ConntrackFlow{
				Forward: tuple("fd00:a1::7", "2001:db8:1::9", 40000, 443, 6, 100, 2),
				Reverse: tuple("2001:db8:1::9", "2001:db8::5", 443, 20001, 6, 900, 3)},
			ok: true, dir: flows.Egress, src: "[fd00:a1::7]:40000", dst: "[2001:db8:1::9]:443", bo: 100, po: 2, bi: 900, pi: 3,
		},
		{
			name: "egress udp of a job with an own address",
			ct: netlink.ConntrackFlow{
				Forward: tuple("fd00:a1::7", "2001:db8:1::9", 5000, 53, 17, 60, 1),
				Reverse: tuple("2001:db8:1::9", "2001:db8:77::7", 53, 5000, 17, 120, 1)},
			ok: true, dir: flows.Egress, src: "[fd00:a1::7]:5000", dst: "[2001:db8:1::9]:53", bo: 60, po: 1, bi: 120, pi: 1,
		},
		{
			name: "inbound to the exposed port at a job's own address",
			ct: netlink.ConntrackFlow{
				Forward: tuple("2001:db8:1::9", "2001:db8:77::7", 33333, 8080, 6, 70, 1),
				Reverse: tuple("fd00:a1::7", "2001:db8:1::9", 8080, 33333, 6, 80, 1)},
			ok: true, dir: flows.Inbound, src: "[2001:db8:1::9]:33333", dst: "[fd00:a1::7]:8080", bo: 80, po: 1, bi: 70, pi: 1,
		},
		{
			name: "unsolicited to an own address",
			ct: netlink.ConntrackFlow{
				Forward: tuple("2001:db8:1::9", "2001:db8:77::7", 33333, 22, 6, 70, 1),
				Reverse: tuple("2001:db8:77::7", "2001:db8:1::9", 22, 33333, 6, 0, 0)},
		},
		{
			name: "IPv6 DNS to the gateway",
			ct:   netlink.ConntrackFlow{Forward: tuple("fd00:a1::7", "fd00:a1::1", 1, 53, 17, 0, 0), Reverse: tuple("fd00:a1::1", "fd00:a1::7", 53, 1, 17, 0, 0)},
		},
		{
			name: "gateway tunnel address as source",
			ct:   netlink.ConntrackFlow{Forward: tuple("100.64.0.1", "192.0.2.9", 1, 2, 6, 0, 0), Reverse: tuple("192.0.2.9", "100.64.0.1", 2, 1, 6, 0, 0)},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := classify(&c.ct, newJobNets(ruleset{tunnels: [2]netip.Prefix{subnet, subnet6}}))
			if ok != c.ok {
				t.Fatalf("ok: got %v, want %v", ok, c.ok)
			}
			if !ok {
				return
			}
			if got.dir != c.dir || got.key.Src.String() != c.src || got.key.Dst.String() != c.dst {
				t.Errorf("got %s %s → %s, want %s %s → %s", got.dir, got.key.Src, got.key.Dst, c.dir, c.src, c.dst)
			}
			if got.bo != c.bo || got.po != c.po || got.bi != c.bi || got.pi != c.pi {
				t.Errorf("counters: got out %d/%d in %d/%d, want out %d/%d in %d/%d", got.bo, got.po, got.bi, got.pi, c.bo, c.po, c.bi, c.pi)
			}
			if got.closed != c.closed {
				t.Errorf("closed: got %v, want %v", got.closed, c.closed)
			}
		})
	}
}
