// SPDX-License-Identifier: MIT

package userstack

import (
	"context"
	"errors"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// pair connects two stacks back to back (what one sends, the other
// receives), standing in for the WireGuard tunnel.
func pair(t *testing.T) (a, b *Stack) {
	t.Helper()
	return pairOf(t,
		Config{Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, DNS: []netip.Addr{netip.MustParseAddr("100.64.0.1")}, MTU: 1420},
		Config{Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.1")}, MTU: 1420})
}

// pairOf is pair with the stacks' configurations.
func pairOf(t *testing.T, ca, cb Config) (a, b *Stack) {
	t.Helper()
	var err error
	a, err = New(ca)
	if err != nil {
		t.Fatal(err)
	}
	b, err = New(cb)
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
	l, err := b.ListenTCP(ipfamily.V4, 80)
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
	pc, err := b.ListenUDP(ipfamily.V4)
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

// TestStackIPv6: with an IPv6 address the stack dials TCP and UDP to IPv6
// destinations from it and looks up AAAA records before A records;
// without one, IPv6 destinations are unreachable (ENETUNREACH).
func TestStackIPv6(t *testing.T) {
	job6, gw6 := netip.MustParseAddr("fd00:a1::2"), netip.MustParseAddr("fd00:a1::1")
	a, b := pairOf(t,
		Config{Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.2"), job6}, DNS: []netip.Addr{netip.MustParseAddr("100.64.0.1")}, MTU: 1420},
		Config{Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.1"), gw6}, MTU: 1420})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	l, err := b.ListenTCP(ipfamily.V6, 80)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	from := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		from <- c.RemoteAddr().String()
		_, _ = io.Copy(c, c)
	}()
	c, err := a.DialTCP(ctx, netip.AddrPortFrom(gw6, 80))
	if err != nil {
		t.Fatalf("DialTCP [%v]:80: %v", gw6, err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("over ipv6")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 9)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "over ipv6" {
		t.Errorf("echo: got %q, %v; want %q", buf, err, "over ipv6")
	}
	c.Close()
	if got := <-from; !strings.HasPrefix(got, "["+job6.String()+"]:") {
		t.Errorf("the IPv6 connection came from %s, want the job's IPv6 address %v", got, job6)
	}

	// UDP from the IPv6 address.
	srv, err := b.ListenUDP(ipfamily.V6)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srvAddr, _ := netip.ParseAddrPort(srv.LocalAddr().String())
	u, err := a.DialUDP(srvAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write([]byte("dgram")); err != nil {
		t.Fatal(err)
	}
	_ = srv.SetDeadline(time.Now().Add(5 * time.Second))
	n, src, err := srv.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "dgram" || !strings.HasPrefix(src.String(), "["+job6.String()+"]:") {
		t.Errorf("udp: got %q from %v (%v), want %q from the job's IPv6 address", buf[:n], src, err, "dgram")
	}

	// DNS: AAAA first, then A.
	srvConn, err := b.dnsListener()
	if err != nil {
		t.Fatal(err)
	}
	ds := &dns.Server{PacketConn: srvConn, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 5}
		switch {
		case q.Name == "dual.test." && q.Qtype == dns.TypeA, q.Name == "v4.test." && q.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IPv4(192, 0, 2, 10)})
		case q.Name == "dual.test." && q.Qtype == dns.TypeAAAA, q.Name == "v6.test." && q.Qtype == dns.TypeAAAA:
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.ParseIP("2001:db8::10")})
		case q.Name == "nx.test.":
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = ds.ActivateAndServe() }()
	defer func() { _ = ds.Shutdown() }()
	for name, want := range map[string][]string{
		"dual.test": {"2001:db8::10", "192.0.2.10"},
		"v4.test":   {"192.0.2.10"},
		"v6.test":   {"2001:db8::10"},
	} {
		addrs, err := a.LookupHost(ctx, name)
		var got []string
		for _, x := range addrs {
			got = append(got, x.String())
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("LookupHost(%s) = %v, %v; want %v", name, got, err, want)
		}
	}

	var de *net.DNSError
	if _, err := a.LookupHost(ctx, "nx.test"); !asDNSError(err, &de) || !de.IsNotFound {
		t.Errorf("LookupHost(nx.test) error %v, want not found", err)
	}
	if addrs, err := a.LookupHost(ctx, "none.test"); err == nil || len(addrs) != 0 {
		t.Errorf("LookupHost(none.test) = %v, %v; want no addresses and an error", addrs, err)
	}

	// A stack without an IPv6 address refuses IPv6 destinations.
	v4only, err := New(Config{Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.3")}, MTU: 1420})
	if err != nil {
		t.Fatal(err)
	}
	defer v4only.Close()
	if _, err := v4only.DialTCP(ctx, netip.AddrPortFrom(gw6, 80)); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("DialTCP to IPv6 without an IPv6 address: got %v, want ENETUNREACH", err)
	}
	if _, err := v4only.DialUDP(netip.AddrPortFrom(gw6, 53)); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("DialUDP to IPv6 without an IPv6 address: got %v, want ENETUNREACH", err)
	}
	if _, err := v4only.ListenUDP(ipfamily.V6); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("ListenUDP(v6) without an IPv6 address: got %v, want ENETUNREACH", err)
	}
}
