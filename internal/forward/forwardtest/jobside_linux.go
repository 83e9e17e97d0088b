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

	"github.com/airlock-vpn/airlock/internal/ipfamily"
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

// newJobNet starts reading dev with readers goroutines at once, as the
// WireGuard device reads a backend (forward.Backend.Queues); stop with
// close after closing dev.
func newJobNet(dev tun.Device, mtu, readers int) *jobNet {
	n := &jobNet{dev: dev, mtu: mtu, jobs: make(map[netip.Addr]*channel.Endpoint)}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	for range max(readers, 1) {
		n.wg.Add(1)
		go n.readLoop()
	}
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
	f := ipfamily.OfPacket(b)
	if f == nil || len(b) < f.HeaderLen {
		return
	}
	dst, proto := f.Addr(b, f.DstOff), networkProto[f.Index]
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
	// Addrs are the job's tunnel addresses by family (zero: none).
	Addrs [ipfamily.N]netip.Addr
	s     *stack.Stack
}

// Addr returns the job's tunnel address of family f (zero: none).
func (j *JobStack) Addr(f *ipfamily.Family) netip.Addr { return j.Addrs[f.Index] }

// networkProto are gVisor's network protocol numbers by family.
var networkProto = [ipfamily.N]tcpip.NetworkProtocolNumber{ipv4.ProtocolNumber, ipv6.ProtocolNumber}

// linkQueue is a job link's queue length in packets: a job's largest
// send buffer in MTU packets, so the channel endpoint never drops.
func linkQueue(mtu int) int { return 2 * (4 << 20) / mtu }

// addJob attaches a new job stack with the job's addresses addrs (at most
// one per family), each with the length of the tunnel subnet of its
// family in tunnels, and a default route of each family; it is removed in
// t.Cleanup.
func (n *jobNet) addJob(t testing.TB, tunnels []netip.Prefix, addrs []netip.Addr) *JobStack {
	t.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	sack := tcpip.TCPSACKEnabled(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	ep := channel.New(linkQueue(n.mtu), uint32(n.mtu), "")
	if err := s.CreateNIC(1, ep); err != nil {
		t.Fatalf("job %v: create nic: %v", addrs, err)
	}
	j := &JobStack{s: s}
	var routes []tcpip.Route
	for _, a := range addrs {
		f := ipfamily.Of(a)
		pa := tcpip.ProtocolAddress{
			Protocol:          networkProto[f.Index],
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(a.AsSlice()), PrefixLen: bitsOf(f, tunnels)},
		}
		if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
			t.Fatalf("job %v: add address %v: %v", addrs, a, err)
		}
		routes = append(routes, tcpip.Route{Destination: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(f.Unspecified.AsSlice())}.Subnet(), NIC: 1})
		j.Addrs[f.Index] = a
	}
	s.SetRouteTable(routes)

	n.mu.Lock()
	for _, a := range addrs {
		n.jobs[a] = ep
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
		for _, a := range addrs {
			delete(n.jobs, a)
		}
		n.mu.Unlock()
		cancel()
		<-done
		s.Close()
		ep.Close()
		s.Wait()
	})
	return j
}

// bitsOf returns the length of the subnet of family f in tunnels (the
// family's full length without one).
func bitsOf(f *ipfamily.Family, tunnels []netip.Prefix) int {
	for _, p := range tunnels {
		if f.Contains(p.Addr()) {
			return p.Bits()
		}
	}
	return f.Bits
}

func fullAddr(ap netip.AddrPort) (tcpip.FullAddress, tcpip.NetworkProtocolNumber) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(ap.Addr().AsSlice()), Port: ap.Port()}, networkProto[ipfamily.Of(ap.Addr()).Index]
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

// ListenTCP listens on the job's address of family f, port port.
func (j *JobStack) ListenTCP(f *ipfamily.Family, port uint16) (*gonet.TCPListener, error) {
	fa, proto := fullAddr(netip.AddrPortFrom(j.Addr(f), port))
	return gonet.ListenTCP(j.s, fa, proto)
}

// ListenUDP binds a UDP socket on the job's address of family f, port
// port.
func (j *JobStack) ListenUDP(f *ipfamily.Family, port uint16) (*gonet.UDPConn, error) {
	fa, proto := fullAddr(netip.AddrPortFrom(j.Addr(f), port))
	return gonet.DialUDP(j.s, &fa, nil, proto)
}

// icmpProto are gVisor's ICMP transport protocol numbers by family.
var icmpProto = [ipfamily.N]tcpip.TransportProtocolNumber{icmp.ProtocolNumber4, icmp.ProtocolNumber6}

// Ping sends one echo request (ICMP or ICMPv6, by dst's family) with
// payload to dst from the job and waits until timeout for its reply.
func (j *JobStack) Ping(dst netip.Addr, payload []byte, timeout time.Duration) error {
	f := ipfamily.Of(dst)
	var wq waiter.Queue
	ep, terr := j.s.NewEndpoint(icmpProto[f.Index], networkProto[f.Index], &wq)
	if terr != nil {
		return fmt.Errorf("ping endpoint: %s", terr)
	}
	defer ep.Close()
	we, ch := waiter.NewChannelEntry(waiter.ReadableEvents)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)

	// Echo request and reply share ICMP's and ICMPv6's layout.
	msg := make([]byte, header.ICMPv4MinimumSize+len(payload))
	msg[0] = f.EchoRequest
	header.ICMPv4(msg).SetSequence(1)
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
		reply := w.b
		if len(reply) >= header.ICMPv4MinimumSize && reply[0] == f.EchoReply {
			if got := string(reply[header.ICMPv4MinimumSize:]); got != string(payload) {
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
