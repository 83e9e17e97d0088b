// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/test/topology"
)

var (
	gwPrefix = netip.MustParsePrefix("100.64.0.1/16")
	jobAddr  = netip.MustParseAddr("100.64.0.2")
)

// testLogger logs everything, including per-flow Debug, to nowhere, so the
// logging paths run without output after a test ends.
func testLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// checkGoroutines registers a cleanup, to run after all cleanups registered
// later, that fails the test if the goroutine count does not return to its
// value now within 2 s.
func checkGoroutines(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		if !topology.Poll(2*time.Second, func() bool { return runtime.NumGoroutine() <= base }) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("goroutines: got %d, want <= %d\n%s", runtime.NumGoroutine(), base, buf)
		}
	})
}

// dialer is a Config.Dial hook that maps job destinations to local test
// servers and records every call.
type dialer struct {
	mu     sync.Mutex
	routes map[string]string // job destination "ip:port" -> real address
	calls  []string
}

func newDialer() *dialer { return &dialer{routes: make(map[string]string)} }

func (d *dialer) route(jobDst, real string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.routes[jobDst] = real
}

func (d *dialer) Calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.calls...)
}

func (d *dialer) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.calls = append(d.calls, network+" "+address)
	real, ok := d.routes[address]
	d.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("test dial %s %s: no route", network, address)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, strings.TrimRight(network, "46"), real)
}

// pumpOffset is where packets start in the buffers the job → gateway pump
// hands to Write, as in wireguard-go.
const pumpOffset = 16

// pair is a gateway Stack and a plain gVisor "job" stack wired together by
// packet pumps, like a job and the gateway across WireGuard.
type pair struct {
	s     *Stack
	dial  *dialer
	job   *stack.Stack
	jobEP *channel.Endpoint
}

// testJob is a job as AddJob takes it: ID id at tunnel addresses addrs.
func testJob(id jobs.ID, addrs ...netip.Addr) forward.Job {
	return forward.Job{ID: id, Addrs: addrs}
}

// newPair builds a pair; cfg's Logger, Addrs and Dial are filled in if
// unset. Everything is torn down in t.Cleanup.
func newPair(t *testing.T, cfg Config) *pair {
	t.Helper()
	p := &pair{dial: newDialer()}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	if len(cfg.Addrs) == 0 {
		cfg.Addrs = []netip.Prefix{gwPrefix}
	}
	if cfg.Dial == nil {
		cfg.Dial = p.dial.Dial
	}
	if len(cfg.DNSUpstreams) == 0 {
		cfg.DNSUpstreams = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	p.s = s
	p.job, p.jobEP = newJobStack(t, s.cfg.MTU)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // job -> gateway
		defer wg.Done()
		for {
			pkt := p.jobEP.ReadContext(ctx)
			if pkt == nil {
				return
			}
			v := pkt.ToView()
			pkt.DecRef()
			// With wireguard-go's headroom, which the kernel TCP
			// path's TUN needs for its virtio header.
			b := make([]byte, pumpOffset+v.Size())
			copy(b[pumpOffset:], v.AsSlice())
			v.Release()
			_, err := s.Write([][]byte{b}, pumpOffset)
			if err != nil {
				return
			}
		}
	}()
	go func() { // gateway -> job
		defer wg.Done()
		bufs := make([][]byte, s.BatchSize())
		for i := range bufs {
			bufs[i] = make([]byte, 65536)
		}
		sizes := make([]int, len(bufs))
		for {
			n, err := s.Read(bufs, sizes, 0)
			if err != nil {
				return
			}
			for i := range n {
				injectJob(p.jobEP, bufs[i][:sizes[i]])
			}
		}
	}()
	t.Cleanup(func() {
		s.Close()
		cancel()
		wg.Wait()
		p.job.Close()
		p.jobEP.Close()
		p.job.Wait()
	})
	return p
}

func injectJob(ep *channel.Endpoint, b []byte) {
	proto := ipv4.ProtocolNumber
	if len(b) > 0 && b[0]>>4 == 6 {
		proto = ipv6.ProtocolNumber
	}
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	ep.InjectInbound(proto, pb)
	pb.DecRef()
}

// jobLinkQueue is the job link's queue length in packets: the job stack's
// largest send buffer in MTU-sized packets, with room to spare.
func jobLinkQueue(mtu int) int { return 2 * (8 << 20) / mtu }

// newJobStack returns a plain gVisor stack with address jobAddr and default
// routes, standing in for the job's kernel.
func newJobStack(t *testing.T, mtu int) (*stack.Stack, *channel.Endpoint) {
	t.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	sack := tcpip.TCPSACKEnabled(true)
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: 1 << 20, Max: 8 << 20}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &rcv)
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4096, Default: 1 << 20, Max: 8 << 20}
	s.SetTransportProtocolOption(tcp.ProtocolNumber, &snd)
	// The job's link queue holds the job's whole TCP send buffer (8 MiB
	// in MTU packets), as a kernel's TSQ and qdisc backpressure would:
	// gVisor's channel endpoint drops silently when full, and with a
	// 1024-packet queue a CPU-starved pump lost ~800 packets of one
	// burst, after which the job's gVisor TCP sat in recovery until the
	// test's 20 s deadline (1-2 in 40 runs under 3 busy loops). Those
	// were the harness's losses, not the gateway's.
	ep := channel.New(jobLinkQueue(mtu), uint32(mtu), "")
	if err := s.CreateNIC(1, ep); err != nil {
		t.Fatalf("job CreateNIC: %v", err)
	}
	pa := tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(jobAddr.As4()), PrefixLen: 16},
	}
	if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
		t.Fatalf("job AddProtocolAddress: %v", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: 1}})
	return s, ep
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(ap.Addr().AsSlice()), Port: ap.Port()}
}

// jobDialTCP connects from the job stack to dst.
func (p *pair) jobDialTCP(ctx context.Context, dst string) (*gonet.TCPConn, error) {
	return gonet.DialContextTCP(ctx, p.job, fullAddr(netip.MustParseAddrPort(dst)), ipv4.ProtocolNumber)
}

// jobDialUDP opens a connected UDP socket from the job stack to dst.
func (p *pair) jobDialUDP(t *testing.T, dst string) *gonet.UDPConn {
	t.Helper()
	fa := fullAddr(netip.MustParseAddrPort(dst))
	c, err := gonet.DialUDP(p.job, nil, &fa, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatalf("job dial udp %s: %v", dst, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// listenTCP starts a loopback TCP server running handle per connection,
// stopped in t.Cleanup.
func listenTCP(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T, network string) string {
	t.Helper()
	switch network {
	case "tcp":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		return addr
	default:
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := c.LocalAddr().String()
		c.Close()
		return addr
	}
}

// isRefused reports whether err looks like a refused or reset connection.
func isRefused(err error) bool {
	if err == nil {
		return false
	}
	var terr *net.OpError
	msg := err.Error()
	return errors.As(err, &terr) && (strings.Contains(msg, "refused") || strings.Contains(msg, "reset"))
}
