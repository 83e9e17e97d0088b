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
	gw := subnet.Addr()
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
			name: "gateway tunnel address as source",
			ct:   netlink.ConntrackFlow{Forward: tuple("100.64.0.1", "192.0.2.9", 1, 2, 6, 0, 0), Reverse: tuple("192.0.2.9", "100.64.0.1", 2, 1, 6, 0, 0)},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := classify(&c.ct, subnet.Masked(), gw)
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
