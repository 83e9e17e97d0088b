// SPDX-License-Identifier: MIT

package bypass

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.zx2c4.com/wireguard/tun"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/gateway/bypassconf"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// gatewayDNS is the far end of the tunnel in the origin tests: a gVisor
// stack with the gateway's tunnel addresses whose TCP DNS server answers
// every A question with 192.0.2.53.
func gatewayDNS(t *testing.T) (*stack.Stack, *channel.Endpoint) {
	t.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol},
	})
	ep := channel.New(256, 1420, "")
	if err := s.CreateNIC(1, ep); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{dnsAddr, dnsAddr6} {
		f := ipfamily.Of(a)
		pa := tcpip.ProtocolAddress{Protocol: networkProto[f.Index], AddressWithPrefix: tcpip.AddrFromSlice(a.AsSlice()).WithPrefix()}
		if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
			t.Fatal(err)
		}
	}
	s.SetRouteTable([]tcpip.Route{{Destination: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4([4]byte{})}.Subnet(), NIC: 1},
		{Destination: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom16([16]byte{})}.Subnet(), NIC: 1}})
	ln, err := gonet.ListenTCP(s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(dnsAddr.AsSlice()), Port: 53}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{Listener: ln, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 192.0.2.53")
		m.Answer = append(m.Answer, rr)
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() {
		srv.Shutdown()
		s.Close()
		ep.Close()
		s.Wait()
	})
	return s, ep
}

// TestOriginDNS checks DNS over TCP in netns mode's bypass: a query for a
// name outside the local domains goes to the gateway's resolver through
// the tunnel, from the job's address and an origin port (the Device's
// Read side), and the gateway's answer comes back through the Device's
// Write side, which keeps it from the job; local names are left to the
// site resolvers, and UDP queries to the upstreams.
func TestOriginDNS(t *testing.T) {
	eng := NewEngine(slog.New(slog.DiscardHandler))
	if err := eng.Update(&control.Bypass{LocalDomains: []string{"site.test"}, Resolvers: []netip.AddrPort{netip.MustParseAddrPort("10.20.0.53:53")},
		Policy: control.Policy{Default: "allow"}}); err != nil {
		t.Fatal(err)
	}
	job := &fakeTUN{}
	d := &Device{Device: job, eng: eng, log: eng.log, job: [ipfamily.N]netip.Addr{jobAddr, jobAddr6}, dns: [ipfamily.N]netip.Addr{dnsAddr, dnsAddr6}}
	wake := make(chan struct{}, 1) // the stack's "packets for the gateway"
	o, err := newOriginStack(d.job, 1420, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	d.origin.Store(o)
	defer d.closeOrigin()
	_, gwEP := gatewayDNS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The tunnel: what Read gives WireGuard reaches the gateway; what the
	// gateway sends goes through Write.
	go func() {
		bufs := [][]byte{make([]byte, 16+65535)}
		sizes := []int{0}
		for ctx.Err() == nil {
			if o.read(bufs, sizes, 16) == 0 {
				select {
				case <-wake:
				case <-ctx.Done():
				}
				continue
			}
			p := append([]byte(nil), bufs[0][16:16+sizes[0]]...)
			pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(p)})
			gwEP.InjectInbound(networkProto[ipfamily.OfPacket(p).Index], pb)
			pb.DecRef()
		}
	}()
	go func() {
		for {
			pkt := gwEP.ReadContext(ctx)
			if pkt == nil {
				return
			}
			v := pkt.ToView()
			pkt.DecRef()
			b := append(make([]byte, 16), v.AsSlice()...)
			v.Release()
			d.Write([][]byte{b}, 16)
		}
	}()

	q := new(dns.Msg)
	q.SetQuestion("example.org.", dns.TypeA)
	resp, ok, err := d.routeDNS(ctx, q, "tcp")
	if !ok || err != nil || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "192.0.2.53" {
		t.Fatalf("routeDNS(example.org over tcp) = %v, %v, %v; want the gateway's answer 192.0.2.53", resp, ok, err)
	}
	if n := job.writes.Load(); n != 0 {
		t.Errorf("%d of the gateway's packets to the origin stack reached the job", n)
	}
	q.SetQuestion("squid.site.test.", dns.TypeA)
	if _, ok, _ := d.routeDNS(ctx, q, "tcp"); ok {
		t.Error("a local name over tcp: taken from the site resolvers")
	}
	q.SetQuestion("example.org.", dns.TypeA)
	if _, ok, _ := d.routeDNS(ctx, q, "udp"); ok {
		t.Error("a query over udp: taken from the upstreams")
	}
	// A packet of the job's own connections is the job's.
	other := make([]byte, 16+40)
	other[16] = 0x45
	other[16+9] = 6
	copy(other[16+16:], jobAddr.AsSlice())
	other[16+22], other[16+23] = 0x9c, 0x40 // port 40000
	d.Write([][]byte{other}, 16)
	if n := job.writes.Load(); n != 1 {
		t.Errorf("a packet to the job's port 40000: %d written to the job, want 1", n)
	}
}

// TestDivertsTCPDNS: with a TUN whose reads can be interrupted (the origin
// stack's way out), a TCP connection to the job's resolver is diverted
// whole when there are local domains.
func TestDivertsTCPDNS(t *testing.T) {
	cfg := testConfig(t, "10.20.0.53")
	s, err := Compile(bypassconf.ForJob(cfg.Bypass, cfg.Policy, "x"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := &Device{job: [ipfamily.N]netip.Addr{jobAddr, jobAddr6}, dns: [ipfamily.N]netip.Addr{dnsAddr, dnsAddr6}, file: f}
	syn := make([]byte, 40)
	syn[0] = 0x45
	syn[9] = 6
	copy(syn[12:16], jobAddr.AsSlice())
	copy(syn[16:20], dnsAddr.AsSlice())
	syn[22], syn[23] = 0, 53
	if !d.diverts(s, syn) {
		t.Error("tcp to the job's resolver, port 53, with local domains: not diverted")
	}
	empty, _ := Compile(&control.Bypass{})
	if d.diverts(empty, syn) {
		t.Error("tcp to the job's resolver without local domains: diverted")
	}
	d.file = nil
	if d.diverts(s, syn) {
		t.Error("tcp to the job's resolver without a way to the gateway's resolver: diverted")
	}
}

// fakeTUN is a job's TUN that counts the packets written to it.
type fakeTUN struct {
	tun.Device // nil: only Write and File
	writes     atomic.Int64
}

func (f *fakeTUN) Write(bufs [][]byte, off int) (int, error) {
	f.writes.Add(int64(len(bufs)))
	return len(bufs), nil
}

func (f *fakeTUN) File() *os.File { return nil }
