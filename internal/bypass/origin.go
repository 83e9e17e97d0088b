// SPDX-License-Identifier: MIT

package bypass

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// The origin stack's ports: above the job's kernel's ephemeral range
// (Linux's default 32768-60999), so the job's own connections never use
// them unless it binds them explicitly.
const (
	originPortLo = 61000
	originPortHi = 61099
)

// originQueue is how many packets for the gateway the origin stack
// queues before it drops (TCP retransmits).
const originQueue = 256

// originStack is a small TCP/IP stack on the WireGuard side of the netns
// mode's bypass Device, with the job's own addresses: it opens TCP
// connections through the tunnel as the job, from ports the job's kernel
// does not pick (originPortLo-originPortHi). The Device sends its
// packets to the gateway with the job's (Read) and hands it the
// gateway's packets to those ports (Write). The bypass uses it for DNS
// over TCP: a connection to the job's resolver is terminated in the
// bypass netstack, which answers local names from the site resolvers
// and asks the gateway's resolver the rest through this stack.
type originStack struct {
	s      *stack.Stack
	ep     *channel.Endpoint
	job    [ipfamily.N]netip.Addr
	out    chan []byte
	wake   func()
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// networkProto are gVisor's network protocol numbers by family.
var networkProto = [ipfamily.N]tcpip.NetworkProtocolNumber{ipv4.ProtocolNumber, ipv6.ProtocolNumber}

// newOriginStack makes the stack with the job's addresses job (zero: none
// of that family) and MTU mtu; wake is called when packets for the
// gateway are queued.
func newOriginStack(job [ipfamily.N]netip.Addr, mtu int, wake func()) (*originStack, error) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	if err := s.SetPortRange(originPortLo, originPortHi); err != nil {
		s.Close()
		return nil, fmt.Errorf("origin stack: port range: %s", err)
	}
	ep := channel.New(originQueue, uint32(mtu), "")
	if err := s.CreateNIC(1, ep); err != nil {
		s.Close()
		return nil, fmt.Errorf("origin stack: nic: %s", err)
	}
	var routes []tcpip.Route
	for _, f := range ipfamily.All {
		a := job[f.Index]
		if !a.IsValid() {
			continue
		}
		pa := tcpip.ProtocolAddress{Protocol: networkProto[f.Index], AddressWithPrefix: tcpip.AddrFromSlice(a.AsSlice()).WithPrefix()}
		if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
			s.Close()
			return nil, fmt.Errorf("origin stack: address %s: %s", a, err)
		}
		routes = append(routes, tcpip.Route{Destination: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(f.Unspecified.AsSlice())}.Subnet(), NIC: 1})
	}
	s.SetRouteTable(routes)
	ctx, cancel := context.WithCancel(context.Background())
	o := &originStack{s: s, ep: ep, job: job, out: make(chan []byte, originQueue), wake: wake, cancel: cancel}
	o.wg.Add(1)
	go o.pump(ctx)
	return o, nil
}

// pump queues the stack's packets for the gateway.
func (o *originStack) pump(ctx context.Context) {
	defer o.wg.Done()
	for {
		pkt := o.ep.ReadContext(ctx)
		if pkt == nil {
			return
		}
		v := pkt.ToView()
		pkt.DecRef()
		b := append([]byte(nil), v.AsSlice()...)
		v.Release()
		select {
		case o.out <- b:
			o.wake()
		default: // full: dropped, TCP retransmits
		}
	}
}

// read moves queued packets into bufs[i][off:] without blocking and
// returns how many.
func (o *originStack) read(bufs [][]byte, sizes []int, off int) int {
	n := 0
	for n < len(bufs) {
		select {
		case b := <-o.out:
			if len(b) > len(bufs[n])-off {
				continue // does not fit: dropped
			}
			sizes[n] = copy(bufs[n][off:], b)
			n++
		default:
			return n
		}
	}
	return n
}

// takes reports whether the gateway's packet p (to the job) is the origin
// stack's: TCP to the job's address of its family, to one of the stack's
// ports (IPv6: directly after the fixed header).
func (o *originStack) takes(p []byte) bool {
	f := ipfamily.OfPacket(p)
	if f == nil || len(p) < f.HeaderLen || p[f.ProtoOff] != 6 {
		return false
	}
	off, _, ok := f.PayloadOffset(p)
	if !ok || len(p) < off+4 || f.Addr(p, f.DstOff) != o.job[f.Index] {
		return false
	}
	port := uint16(p[off+2])<<8 | uint16(p[off+3])
	return port >= originPortLo && port <= originPortHi
}

// deliver hands the gateway's packet p to the stack (a copy).
func (o *originStack) deliver(p []byte) {
	f := ipfamily.OfPacket(p)
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), p...))})
	o.ep.InjectInbound(networkProto[f.Index], pb)
	pb.DecRef()
}

// dialTCP connects through the tunnel to dst, from the job's address of
// dst's family.
func (o *originStack) dialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	f := ipfamily.Of(dst.Addr())
	if f == nil || !o.job[f.Index].IsValid() {
		return nil, errors.New("origin stack: no job address of the destination's family")
	}
	fa := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(dst.Addr().Unmap().AsSlice()), Port: dst.Port()}
	return gonet.DialContextTCP(ctx, o.s, fa, networkProto[f.Index])
}

// close stops the stack and its pump.
func (o *originStack) close() {
	o.cancel()
	o.wg.Wait()
	o.s.Close()
	o.ep.Close()
	o.s.Wait()
}
