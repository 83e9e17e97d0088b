// SPDX-License-Identifier: MIT

package forwardtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// deviceOffset is the headroom in front of every packet handed to the
// device's Read and Write, as the WireGuard device leaves it (a kernel
// TUN's virtio-net header needs 10 bytes).
const deviceOffset = 16

// jobNet is the job side: one gVisor stack per job address, all attached
// to one packet device. Packets the device reads are delivered to the
// stack of their destination address; the others are dropped.
type jobNet struct {
	dev tun.Device
	mtu int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	jobs map[netip.Addr]*channel.Endpoint
}

// newJobNet starts reading dev; stop with close after closing dev.
func newJobNet(dev tun.Device, mtu int) *jobNet {
	n := &jobNet{dev: dev, mtu: mtu, jobs: make(map[netip.Addr]*channel.Endpoint)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.wg.Add(1)
	go n.readLoop()
	return n
}

func (n *jobNet) readLoop() {
	defer n.wg.Done()
	bufs := make([][]byte, n.dev.BatchSize())
	for i := range bufs {
		bufs[i] = make([]byte, deviceOffset+65535)
	}
	sizes := make([]int, len(bufs))
	for {
		cnt, err := n.dev.Read(bufs, sizes, deviceOffset)
		if err != nil {
			if errors.Is(err, tun.ErrTooManySegments) {
				continue
			}
			return
		}
		for i := range cnt {
			n.deliver(bufs[i][deviceOffset : deviceOffset+sizes[i]])
		}
	}
}

func (n *jobNet) deliver(b []byte) {
	var dst netip.Addr
	proto := ipv4.ProtocolNumber
	switch {
	case len(b) >= header.IPv4MinimumSize && b[0]>>4 == 4:
		dst = netip.AddrFrom4([4]byte(b[16:20]))
	case len(b) >= header.IPv6MinimumSize && b[0]>>4 == 6:
		dst = netip.AddrFrom16([16]byte(b[24:40]))
		proto = ipv6.ProtocolNumber
	default:
		return
	}
	n.mu.Lock()
	ep := n.jobs[dst]
	n.mu.Unlock()
	if ep == nil {
		return
	}
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	ep.InjectInbound(proto, pb)
	pb.DecRef()
}

// close stops the pumps; the device must be closed first (it unblocks
// Read).
func (n *jobNet) close() {
	n.cancel()
	n.wg.Wait()
}

// JobStack is one job's network as the job sees it: a gVisor stack with the
// job's tunnel address (and, if set, its IPv6 address) and default routes
// into the backend's device.
type JobStack struct {
	// Addr is the job's tunnel address.
	Addr netip.Addr
	// Addr6 is the job's IPv6 address, if it has one.
	Addr6 netip.Addr
	s     *stack.Stack
}

// linkQueue is a job link's queue length in packets: a job's largest
// send buffer in MTU packets, so the channel endpoint never drops.
func linkQueue(mtu int) int { return 2 * (4 << 20) / mtu }

// addJob attaches a new job stack with addresses addr (in prefix's
// subnet) and addr6 (optional); it is removed in t.Cleanup.
func (n *jobNet) addJob(t testing.TB, prefix netip.Prefix, addr, addr6 netip.Addr) *JobStack {
	t.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	sack := tcpip.TCPSACKEnabled(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	ep := channel.New(linkQueue(n.mtu), uint32(n.mtu), "")
	if err := s.CreateNIC(1, ep); err != nil {
		t.Fatalf("job %s: create nic: %v", addr, err)
	}
	pa := tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(addr.As4()), PrefixLen: prefix.Bits()},
	}
	if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
		t.Fatalf("job %s: add address: %v", addr, err)
	}
	routes := []tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}}
	if addr6.IsValid() {
		pa6 := tcpip.ProtocolAddress{
			Protocol:          ipv6.ProtocolNumber,
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom16(addr6.As16()), PrefixLen: 64},
		}
		if err := s.AddProtocolAddress(1, pa6, stack.AddressProperties{}); err != nil {
			t.Fatalf("job %s: add address %s: %v", addr, addr6, err)
		}
		routes = append(routes, tcpip.Route{Destination: header.IPv6EmptySubnet, NIC: 1})
	}
	s.SetRouteTable(routes)
	j := &JobStack{Addr: addr, Addr6: addr6, s: s}

	n.mu.Lock()
	n.jobs[addr] = ep
	if addr6.IsValid() {
		n.jobs[addr6] = ep
	}
	n.mu.Unlock()
	ctx, cancel := context.WithCancel(n.ctx)
	done := make(chan struct{})
	go func() { // job -> device
		defer close(done)
		for {
			pkt := ep.ReadContext(ctx)
			if pkt == nil {
				return
			}
			v := pkt.ToView()
			pkt.DecRef()
			b := make([]byte, deviceOffset+v.Size())
			copy(b[deviceOffset:], v.AsSlice())
			v.Release()
			if _, err := n.dev.Write([][]byte{b}, deviceOffset); err != nil && ctx.Err() != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		n.mu.Lock()
		delete(n.jobs, addr)
		delete(n.jobs, addr6)
		n.mu.Unlock()
		cancel()
		<-done
		s.Close()
		ep.Close()
		s.Wait()
	})
	return j
}

func fullAddr(ap netip.AddrPort) (tcpip.FullAddress, tcpip.NetworkProtocolNumber) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	proto := ipv4.ProtocolNumber
	if ap.Addr().Is6() {
		proto = ipv6.ProtocolNumber
	}
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(ap.Addr().AsSlice()), Port: ap.Port()}, proto
}

// DialTCP connects from the job to dst.
func (j *JobStack) DialTCP(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	fa, proto := fullAddr(dst)
	return gonet.DialContextTCP(ctx, j.s, fa, proto)
}

// DialUDP opens a connected UDP socket from the job to dst.
func (j *JobStack) DialUDP(dst netip.AddrPort) (*gonet.UDPConn, error) {
	fa, proto := fullAddr(dst)
	return gonet.DialUDP(j.s, nil, &fa, proto)
}

// ListenTCP listens on the job's address, port port.
func (j *JobStack) ListenTCP(port uint16) (*gonet.TCPListener, error) {
	fa, proto := fullAddr(netip.AddrPortFrom(j.Addr, port))
	return gonet.ListenTCP(j.s, fa, proto)
}

// ListenUDP binds a UDP socket on the job's address, port port.
func (j *JobStack) ListenUDP(port uint16) (*gonet.UDPConn, error) {
	fa, _ := fullAddr(netip.AddrPortFrom(j.Addr, port))
	return gonet.DialUDP(j.s, &fa, nil, ipv4.ProtocolNumber)
}

// Ping sends one ICMPv4 echo request with payload to dst from the job and
// waits until timeout for its reply.
func (j *JobStack) Ping(dst netip.Addr, payload []byte, timeout time.Duration) error {
	var wq waiter.Queue
	ep, terr := j.s.NewEndpoint(icmp.ProtocolNumber4, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return fmt.Errorf("ping endpoint: %s", terr)
	}
	defer ep.Close()
	we, ch := waiter.NewChannelEntry(waiter.ReadableEvents)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)

	msg := make([]byte, header.ICMPv4MinimumSize+len(payload))
	icmpHdr := header.ICMPv4(msg)
	icmpHdr.SetType(header.ICMPv4Echo)
	icmpHdr.SetSequence(1)
	copy(msg[header.ICMPv4MinimumSize:], payload)
	fa, _ := fullAddr(netip.AddrPortFrom(dst, 0))
	var r bytesReader
	r.b = msg
	if _, terr := ep.Write(&r, tcpip.WriteOptions{To: &fa}); terr != nil {
		return fmt.Errorf("ping %s: write: %s", dst, terr)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		var w bytesWriter
		_, terr := ep.Read(&w, tcpip.ReadOptions{})
		if _, ok := terr.(*tcpip.ErrWouldBlock); ok {
			select {
			case <-ch:
				continue
			case <-deadline.C:
				return fmt.Errorf("ping %s: no reply in %v", dst, timeout)
			}
		}
		if terr != nil {
			return fmt.Errorf("ping %s: read: %s", dst, terr)
		}
		reply := header.ICMPv4(w.b)
		if len(reply) >= header.ICMPv4MinimumSize && reply.Type() == header.ICMPv4EchoReply {
			if got := string(reply.Payload()); got != string(payload) {
				return fmt.Errorf("ping %s: reply payload %q, want %q", dst, got, payload)
			}
			return nil
		}
	}
}

type bytesReader struct {
	b []byte
}

func (r *bytesReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, net.ErrClosed
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *bytesReader) Len() int { return len(r.b) }

type bytesWriter struct{ b []byte }

func (w *bytesWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
