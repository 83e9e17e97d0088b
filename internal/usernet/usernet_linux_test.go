// SPDX-License-Identifier: MIT

package usernet

import (
	"context"
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
// over each address family, through one namespace for both.
func TestHandshakeReachesListener(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := Open(ctx, []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16"), netip.MustParsePrefix("fd00:a10c::/64")}, 1420)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer ns.Close()
	for _, tc := range []struct {
		name     string
		job, dst netip.AddrPort
	}{
		{"IPv4", netip.MustParseAddrPort("100.64.0.2:40000"), netip.MustParseAddrPort("203.0.113.9:5201")},
		{"IPv6", netip.MustParseAddrPort("[fd00:a10c::2]:40000"), netip.MustParseAddrPort("[2001:db8::9]:5201")},
	} {
		t.Run(tc.name, func(t *testing.T) { handshake(t, ns, tc.job, tc.dst) })
	}
}

// TestQdisc: the namespace reports its TUN's qdisc, fq_codel where the
// kernel has it, else why not (the kernel of the test machines is built
// without it: "Specified qdisc kind is unknown").
func TestQdisc(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := Open(ctx, []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16")}, 1420)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer ns.Close()
	if ns.Qdisc != "fq_codel" && !strings.HasPrefix(ns.Qdisc, "the kernel's default (fq_codel: ") {
		t.Fatalf("got Qdisc %q, want fq_codel or the kernel's default and why", ns.Qdisc)
	}
	t.Logf("qdisc: %s", ns.Qdisc)
}

func handshake(t *testing.T, ns *Namespace, job, dst netip.AddrPort) {
	if _, err := ns.TUN.Write(tcpPacket(job, dst, 1000, 0, header.TCPFlagSyn)); err != nil {
		t.Fatalf("write SYN: %v", err)
	}
	buf := make([]byte, 65536)
	var synack header.TCP
	for i := 0; i < 20 && synack == nil; i++ {
		n, err := ns.TUN.Read(buf)
		if err != nil {
			t.Fatalf("read tun: %v", err)
		}
		if tcp := tcpOf(buf[vnetHdrLen:n]); tcp != nil && tcp.Flags() == header.TCPFlagSyn|header.TCPFlagAck {
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
	if _, err := ns.TUN.Write(ack); err != nil {
		t.Fatalf("write ACK: %v", err)
	}
	ns.Listener.SetDeadline(time.Now().Add(5 * time.Second))
	c, err := ns.Listener.AcceptTCP()
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
