package userstack

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// pair connects two stacks back to back (what one sends, the other
// receives), standing in for the WireGuard tunnel.
func pair(t *testing.T) (a, b *Stack) {
	t.Helper()
	var err error
	a, err = New(Config{Addr: netip.MustParseAddr("100.64.0.2"), DNS: []netip.Addr{netip.MustParseAddr("100.64.0.1")}, MTU: 1420})
	if err != nil {
		t.Fatal(err)
	}
	b, err = New(Config{Addr: netip.MustParseAddr("100.64.0.1"), MTU: 1420})
	if err != nil {
		t.Fatal(err)
	}
	pump := func(from, to *Stack) {
		bufs := make([][]byte, batchSize)
		for i := range bufs {
			bufs[i] = make([]byte, 1500)
		}
		sizes := make([]int, batchSize)
		for {
			n, err := from.Read(bufs, sizes, 0)
			if err != nil {
				return
			}
			out := make([][]byte, n)
			for i := range out {
				out[i] = bufs[i][:sizes[i]]
			}
			if _, err := to.Write(out, 0); err != nil {
				return
			}
		}
	}
	go pump(a, b)
	go pump(b, a)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestStack(t *testing.T) {
	a, b := pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// TCP: 4 MiB one way and back, through GSO segments and GRO.
	l, err := b.ListenTCP(80)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	c, err := a.DialTCP(ctx, netip.MustParseAddrPort("100.64.0.1:80"))
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 4<<20)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	go func() { _, _ = c.Write(payload); _ = c.CloseWrite() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || len(got) != len(payload) {
		t.Fatalf("echoed %d bytes (%v), want %d", len(got), err, len(payload))
	}
	for i := range got {
		if got[i] != payload[i] {
			t.Fatalf("byte %d differs", i)
		}
	}
	c.Close()

	// Refused: nobody listens on port 81.
	if _, err := a.DialTCP(ctx, netip.MustParseAddrPort("100.64.0.1:81")); err == nil {
		t.Error("dial to a closed port succeeded")
	}

	// DNS over UDP through the stack.
	pc, err := b.ListenUDP()
	if err != nil {
		t.Fatal(err)
	}
	pc.Close()
	srvConn, err := b.dnsListener()
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: srvConn, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Name == "files.test." && r.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: "files.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(192, 0, 2, 10)})
		} else if r.Question[0].Name != "files.test." {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	defer func() { _ = srv.Shutdown() }()
	addrs, err := a.LookupHost(ctx, "files.test")
	if err != nil || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("192.0.2.10") {
		t.Errorf("LookupHost(files.test) = %v, %v; want [192.0.2.10]", addrs, err)
	}
	_, err = a.LookupHost(ctx, "nx.test")
	var de *net.DNSError
	if !asDNSError(err, &de) || !de.IsNotFound {
		t.Errorf("LookupHost(nx.test) error %v, want not found", err)
	}
}
