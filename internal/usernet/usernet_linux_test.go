// SPDX-License-Identifier: MIT

package usernet

import (
	"context"
	"net"
	"net/netip"
	"os"
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

// tcpPacket builds an IPv4 TCP packet with a zero virtio-net header in
// front, as a TUN with IFF_VNET_HDR expects.
func tcpPacket(src, dst netip.AddrPort, seq, ack uint32, flags header.TCPFlags) []byte {
	b := make([]byte, vnetHdrLen+header.IPv4MinimumSize+header.TCPMinimumSize)
	p := b[vnetHdrLen:]
	ip := header.IPv4(p)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(p)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4(src.Addr().As4()), DstAddr: tcpip.AddrFrom4(dst.Addr().As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(p[header.IPv4MinimumSize:])
	tcp.Encode(&header.TCPFields{
		SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: ack,
		DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), header.TCPMinimumSize)
	tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
	return b
}

// TestHandshakeReachesListener sends a job's SYN for an outside address
// into the TUN, answers the kernel's SYN-ACK, and expects the listener to
// accept a connection whose local address is the original destination.
func TestHandshakeReachesListener(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := Open(ctx, netip.MustParsePrefix("100.64.0.0/16"), 1420)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer ns.Close()

	job := netip.MustParseAddrPort("100.64.0.2:40000")
	dst := netip.MustParseAddrPort("203.0.113.9:5201")
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
		p := header.IPv4(buf[vnetHdrLen:n])
		if p.Protocol() != uint8(header.TCPProtocolNumber) {
			continue
		}
		tcp := header.TCP(p.Payload())
		if tcp.Flags() == header.TCPFlagSyn|header.TCPFlagAck {
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
	if got := c.LocalAddr().(*net.TCPAddr).AddrPort(); got != dst {
		t.Errorf("accepted local address %v, want the job's destination %v", got, dst)
	}
	if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != job {
		t.Errorf("accepted remote address %v, want the job %v", got, job)
	}
}
