// SPDX-License-Identifier: MIT

package usernet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func TestMain(m *testing.M) {
	Init()
	os.Exit(m.Run())
}

const vnetHdrLen = 10 // struct virtio_net_hdr

// tcpPacket builds a TCP packet of src's family with a zero virtio-net
// header in front, as a TUN with IFF_VNET_HDR expects.
func tcpPacket(src, dst netip.AddrPort, seq, ack uint32, flags header.TCPFlags) []byte {
	hl := header.IPv4MinimumSize
	if src.Addr().Is6() {
		hl = header.IPv6MinimumSize
	}
	b := make([]byte, vnetHdrLen+hl+header.TCPMinimumSize)
	p := b[vnetHdrLen:]
	srcA, dstA := tcpip.AddrFromSlice(src.Addr().AsSlice()), tcpip.AddrFromSlice(dst.Addr().AsSlice())
	if src.Addr().Is6() {
		header.IPv6(p).Encode(&header.IPv6Fields{
			PayloadLength: header.TCPMinimumSize, TransportProtocol: header.TCPProtocolNumber, HopLimit: 64,
			SrcAddr: srcA, DstAddr: dstA,
		})
	} else {
		ip := header.IPv4(p)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(p)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
			SrcAddr: srcA, DstAddr: dstA,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
	}
	tcp := header.TCP(p[hl:])
	tcp.Encode(&header.TCPFields{
		SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: ack,
		DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, srcA, dstA, header.TCPMinimumSize)
	tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
	return b
}

// tcpOf returns the TCP segment of the IP packet p, nil if p is not TCP
// (IPv6: without extension headers).
// dstOf returns the destination address of the IP packet p (tcpOf's).
func dstOf(p []byte) netip.Addr {
	if p[0]>>4 == 4 {
		return netip.AddrFrom4([4]byte(p[16:20]))
	}
	return netip.AddrFrom16([16]byte(p[24:40]))
}

func tcpOf(p []byte) header.TCP {
	switch {
	case len(p) >= header.IPv4MinimumSize && p[0]>>4 == 4:
		ip := header.IPv4(p)
		if ip.Protocol() == uint8(header.TCPProtocolNumber) {
			return header.TCP(ip.Payload())
		}
	case len(p) >= header.IPv6MinimumSize && p[0]>>4 == 6:
		ip := header.IPv6(p)
		if ip.TransportProtocol() == header.TCPProtocolNumber {
			return header.TCP(p[header.IPv6MinimumSize:])
		}
	}
	return nil
}

// TestHandshakeReachesListener sends a job's SYN for an outside address
// into the TUN, answers the kernel's SYN-ACK, and expects the listener to
// accept a connection whose local address is the original destination:
// over each address family, through one namespace for both. With 3 queues
// the namespace's TUN is a multi-queue one whose every queue carries a
// job's handshake (the kernel answers on the queue the SYN came from).
func TestHandshakeReachesListener(t *testing.T) {
	for _, queues := range []int{1, 3} {
		t.Run(fmt.Sprintf("queues=%d", queues), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			ns, err := Open(ctx, []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16"), netip.MustParsePrefix("fd00:a10c::/64")}, 1420, queues)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer ns.Close()
			if len(ns.TUN) != queues {
				t.Fatalf("tun queues: got %d files, want %d", len(ns.TUN), queues)
			}
			for q, f := range ns.TUN {
				for _, tc := range []struct {
					name     string
					job, dst netip.AddrPort
				}{
					{"IPv4", netip.MustParseAddrPort(fmt.Sprintf("100.64.0.%d:40000", 2+q)), netip.MustParseAddrPort("203.0.113.9:5201")},
					{"IPv6", netip.MustParseAddrPort(fmt.Sprintf("[fd00:a10c::%d]:40000", 2+q)), netip.MustParseAddrPort("[2001:db8::9]:5201")},
				} {
					t.Run(fmt.Sprintf("queue%d/%s", q, tc.name), func(t *testing.T) { handshake(t, f, ns.Listener, tc.job, tc.dst) })
				}
			}
		})
	}
	if _, err := Open(context.Background(), []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16")}, 1420, 0); err == nil {
		t.Errorf("Open with 0 queues: no error")
	}
}

// TestQdisc: the namespace reports its TUN's qdisc, fq_codel where the
// kernel has it, else why not (the kernel of the test machines is built
// without it: "Specified qdisc kind is unknown").
func TestQdisc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := Open(ctx, []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16")}, 1420, 1)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer ns.Close()
	if ns.Qdisc != "fq_codel" && !strings.HasPrefix(ns.Qdisc, "the kernel's default (fq_codel: ") {
		t.Fatalf("got Qdisc %q, want fq_codel or the kernel's default and why", ns.Qdisc)
	}
	t.Logf("qdisc: %s", ns.Qdisc)
}

func handshake(t *testing.T, tun *os.File, ln *net.TCPListener, job, dst netip.AddrPort) {
	if _, err := tun.Write(tcpPacket(job, dst, 1000, 0, header.TCPFlagSyn)); err != nil {
		t.Fatalf("write SYN: %v", err)
	}
	buf := make([]byte, 65536)
	var synack header.TCP
	for i := 0; i < 20 && synack == nil; i++ {
		n, err := tun.Read(buf)
		if err != nil {
			t.Fatalf("read tun: %v", err)
		}
		// Only the SYN-ACK to this job: an earlier job's retransmitted
		// one may come on any queue (TCP picks a new flow hash when it
		// retransmits).
		if tcp := tcpOf(buf[vnetHdrLen:n]); tcp != nil && tcp.Flags() == header.TCPFlagSyn|header.TCPFlagAck && dstOf(buf[vnetHdrLen:n]) == job.Addr() {
			synack = tcp
		}
	}
	if synack == nil {
		t.Fatal("no SYN-ACK from the namespace's kernel")
	}
	if got, want := synack.AckNumber(), uint32(1001); got != want {
		t.Fatalf("SYN-ACK ack = %d, want %d", got, want)
	}
	ack := tcpPacket(job, dst, 1001, synack.SequenceNumber()+1, header.TCPFlagAck)
	if _, err := tun.Write(ack); err != nil {
		t.Fatalf("write ACK: %v", err)
	}
	ln.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ln.AcceptTCP()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	defer c.Close()
	unmap := func(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }
	if got := unmap(c.LocalAddr().(*net.TCPAddr).AddrPort()); got != dst {
		t.Errorf("accepted local address %v, want the job's destination %v", got, dst)
	}
	if got := unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort()); got != job {
		t.Errorf("accepted remote address %v, want the job %v", got, job)
	}
}
