// SPDX-License-Identifier: MIT

package stacklink

import (
	"bytes"
	"testing"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// gsoPacket builds an outbound TCP segment as the netstack emits it with
// host GSO: headers pushed, a pseudo-header-only checksum, GSOOptions set.
func gsoPacket(v4 bool, payload []byte, mss uint16, flags header.TCPFlags) *stack.PacketBuffer {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{ReserveHeaderBytes: 80, Payload: buffer.MakeWithData(payload)})
	tcp := header.TCP(pkt.TransportHeader().Push(header.TCPMinimumSize))
	tcp.Encode(&header.TCPFields{SrcPort: 80, DstPort: 40000, SeqNum: 0xfffff000, AckNum: 7,
		DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 1000})
	total := header.TCPMinimumSize + len(payload)
	var src, dst tcpip.Address
	if v4 {
		src, dst = tcpip.AddrFrom4([4]byte{198, 51, 100, 7}), tcpip.AddrFrom4([4]byte{100, 64, 0, 2})
		ip := header.IPv4(pkt.NetworkHeader().Push(header.IPv4MinimumSize))
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + total), ID: 100, TTL: 64,
			Protocol: uint8(header.TCPProtocolNumber), SrcAddr: src, DstAddr: dst})
		ip.SetChecksum(^ip.CalculateChecksum())
		pkt.GSOOptions = stack.GSO{Type: stack.GSOTCPv4, NeedsCsum: true, MSS: mss, L3HdrLen: header.IPv4MinimumSize}
	} else {
		src = tcpip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: 7})
		dst = tcpip.AddrFrom16([16]byte{0xfd, 0x00, 15: 2})
		ip := header.IPv6(pkt.NetworkHeader().Push(header.IPv6MinimumSize))
		ip.Encode(&header.IPv6Fields{PayloadLength: uint16(total), TransportProtocol: header.TCPProtocolNumber,
			HopLimit: 64, SrcAddr: src, DstAddr: dst})
		pkt.GSOOptions = stack.GSO{Type: stack.GSOTCPv6, NeedsCsum: true, MSS: mss, L3HdrLen: header.IPv6MinimumSize}
	}
	tcp.SetChecksum(header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(total)))
	return pkt
}

func TestGSOSplit(t *testing.T) {
	payload := make([]byte, 10000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name    string
		v4      bool
		size    int
		mss     uint16
		perRead int // buffers offered per emit call
	}{
		{"v4 split", true, 10000, 1380, 64},
		{"v4 split across reads", true, 10000, 1380, 3},
		{"v4 exact multiple", true, 2760, 1380, 64},
		{"v4 one segment", true, 500, 1380, 64},
		{"v4 no payload", true, 0, 1380, 64},
		{"v6 split", false, 10000, 1360, 64},
		{"v6 split across reads", false, 10000, 1360, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkt := gsoPacket(tc.v4, payload[:tc.size], tc.mss, header.TCPFlagAck|header.TCPFlagPsh|header.TCPFlagFin)
			defer pkt.DecRef()
			e := New(1420, 16, func() { t.Error("packet dropped") })
			const offset = 16
			var got []byte
			var segs [][]byte
			for done := false; !done; {
				bufs := make([][]byte, tc.perRead)
				for i := range bufs {
					bufs[i] = make([]byte, offset+1500)
				}
				sizes := make([]int, len(bufs))
				var n int
				n, done = e.emit(pkt, bufs, sizes, offset)
				for i := range n {
					segs = append(segs, bufs[i][offset:offset+sizes[i]])
				}
				if len(segs) > 100 {
					t.Fatal("emit does not finish")
				}
			}
			want := max(1, (tc.size+int(tc.mss)-1)/int(tc.mss))
			if len(segs) != want {
				t.Fatalf("got %d segments, want %d", len(segs), want)
			}
			seq := uint32(0xfffff000)
			for i, p := range segs {
				var nh int
				var src, dst tcpip.Address
				if tc.v4 {
					ip := header.IPv4(p)
					nh = header.IPv4MinimumSize
					if !ip.IsChecksumValid() || int(ip.TotalLength()) != len(p) || ip.ID() != uint16(100+i) {
						t.Errorf("segment %d: ipv4 header: checksum ok %v, length %d of %d, id %d", i, ip.IsChecksumValid(), ip.TotalLength(), len(p), ip.ID())
					}
					src, dst = ip.SourceAddress(), ip.DestinationAddress()
				} else {
					ip := header.IPv6(p)
					nh = header.IPv6MinimumSize
					if int(ip.PayloadLength()) != len(p)-nh {
						t.Errorf("segment %d: ipv6 payload length %d, want %d", i, ip.PayloadLength(), len(p)-nh)
					}
					src, dst = ip.SourceAddress(), ip.DestinationAddress()
				}
				if len(p) > 1420 {
					t.Errorf("segment %d: %d bytes exceeds the MTU", i, len(p))
				}
				tcp := header.TCP(p[nh:])
				xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(len(tcp)))
				if checksum.Checksum(tcp, xsum) != 0xffff {
					t.Errorf("segment %d: bad tcp checksum", i)
				}
				if tcp.SequenceNumber() != seq {
					t.Errorf("segment %d: seq %#x, want %#x", i, tcp.SequenceNumber(), seq)
				}
				last := i == len(segs)-1
				if fin := tcp.Flags()&(header.TCPFlagFin|header.TCPFlagPsh) != 0; fin != last {
					t.Errorf("segment %d of %d: flags %v", i, len(segs), tcp.Flags())
				}
				data := tcp[tcp.DataOffset():]
				seq += uint32(len(data))
				got = append(got, data...)
			}
			if !bytes.Equal(got, payload[:tc.size]) {
				t.Errorf("reassembled payload differs (%d bytes, want %d)", len(got), tc.size)
			}
		})
	}
}
