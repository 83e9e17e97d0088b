// SPDX-License-Identifier: MIT

package bypass

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/gateway/bypassconf"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/userstack"
	"github.com/airlock-vpn/airlock/test/topology"
)

var (
	jobAddr   = netip.MustParseAddr("100.64.0.2")
	dnsAddr   = netip.MustParseAddr("100.64.0.1")
	siteHost  = netip.MustParseAddr("10.20.0.5")
	jobAddr6  = netip.MustParseAddr("fd00:a1::6440:2")
	dnsAddr6  = netip.MustParseAddr("fd00:a1::6440:1")
	siteHost6 = netip.MustParseAddr("fd20::5")
)

// testConfig is a gateway config with one bypass entry for every token
// (10.20.0.5 and fd20::5, TCP 80 and 3128), one for token "cms" only, local domain
// site.test, and a policy that denies 10.20.0.5:3128.
func testConfig(t *testing.T, resolver string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("t.toml", []byte(`version = 1
[[policy.rule]]
name = "no-3128"
action = "deny"
proto = "tcp"
ports = [3128]
[[policy.rule]]
name = "site"
action = "allow"
to = ["10.20.0.0/16", "fd20::/16"]
[[policy.rule]]
name = "cms-only"
action = "allow"
to = ["10.30.0.0/16"]
tokens = ["cms"]
[[bypass]]
name = "squid"
to = ["10.20.0.5", "fd20::5"]
proto = "tcp"
ports = [80, 3128]
[[bypass]]
name = "cms-storage"
to = ["10.30.0.0/16"]
tokens = ["cms"]
[dns]
local_domains = ["site.test"]
resolvers = ["`+resolver+`"]
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// wire sends b through JSON as the gateway does.
func wire(t *testing.T, b *control.Bypass) *control.Bypass {
	t.Helper()
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var out control.Bypass
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func TestSet(t *testing.T) {
	cfg := testConfig(t, "10.20.0.53")
	for _, tc := range []struct {
		tok                  string
		proto                policy.Proto
		dst                  string
		port                 uint16
		wantRule             string
		wantMatch, wantAllow bool
	}{
		{"other", policy.ProtoTCP, "10.20.0.5", 80, "squid", true, true},
		{"other", policy.ProtoTCP, "10.20.0.5", 3128, "squid", true, false}, // the policy denies it
		{"other", policy.ProtoTCP, "10.20.0.5", 81, "", false, true},        // port outside the entry
		{"other", policy.ProtoUDP, "10.20.0.5", 80, "", false, true},
		{"other", policy.ProtoTCP, "10.20.0.6", 80, "", false, true},
		{"other", policy.ProtoTCP, "10.30.0.1", 80, "", false, false}, // cms's entry and allow
		{"cms", policy.ProtoUDP, "10.30.0.1", 9, "cms-storage", true, true},
	} {
		s, err := Compile(wire(t, bypassconf.ForJob(cfg.Bypass, cfg.Policy, tc.tok)))
		if err != nil {
			t.Fatal(err)
		}
		dst := netip.MustParseAddr(tc.dst)
		rule, ok := s.Match(tc.proto, dst, tc.port)
		if ok != tc.wantMatch || rule != tc.wantRule && ok {
			t.Errorf("token %s: Match(%v %s:%d) = %q, %v; want %q, %v", tc.tok, tc.proto, tc.dst, tc.port, rule, ok, tc.wantRule, tc.wantMatch)
		}
		if v := s.Allowed(tc.proto, dst, tc.port, false); (v.Action == policy.Allow) != tc.wantAllow {
			t.Errorf("token %s: Allowed(%v %s:%d) = %v, want allow %v", tc.tok, tc.proto, tc.dst, tc.port, v, tc.wantAllow)
		}
	}
	s, _ := Compile(wire(t, bypassconf.ForJob(cfg.Bypass, cfg.Policy, "x")))
	for name, want := range map[string]bool{"a.site.test.": true, "SITE.test": true, "xsite.test": false, "site.test.evil": false, "": false} {
		if s.IsLocal(name) != want {
			t.Errorf("IsLocal(%q) = %v, want %v", name, !want, want)
		}
	}
	if bypassconf.ForJob(config.Bypass{}, cfg.Policy, "x") != nil {
		t.Error("ForJob without bypass entries: want nil")
	}
	// Entries never match the floor, whatever the gateway sends.
	s, err := Compile(&control.Bypass{Rules: []control.Rule{{Name: "lo", To: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}, Policy: control.Policy{Default: "allow"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Match(policy.ProtoTCP, netip.MustParseAddr("127.0.0.1"), 22); ok {
		t.Error("a bypass entry matched loopback")
	}
}

func TestCompileRejects(t *testing.T) {
	for name, b := range map[string]*control.Bypass{
		"no destinations": {Rules: []control.Rule{{Name: "a"}}, Policy: control.Policy{Default: "allow"}},
		"action":          {Rules: []control.Rule{{Name: "a", Action: "deny", To: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}, Policy: control.Policy{Default: "allow"}},
		"bad name":        {Rules: []control.Rule{{Name: "a b", To: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}, Policy: control.Policy{Default: "allow"}},
		"unmasked":        {Rules: []control.Rule{{Name: "a", To: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/8")}}}, Policy: control.Policy{Default: "allow"}},
		"port 0":          {Rules: []control.Rule{{Name: "a", To: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Ports: [][2]uint16{{0, 5}}}}, Policy: control.Policy{Default: "allow"}},
		"bad default":     {Policy: control.Policy{Default: "maybe"}},
		"no resolver":     {LocalDomains: []string{"a.b"}, Policy: control.Policy{Default: "allow"}},
	} {
		if _, err := Compile(b); err == nil {
			t.Errorf("%s: compiled", name)
		}
	}
}

func TestQueryName(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("Squid.Site.Test.", dns.TypeA)
	b, _ := m.Pack()
	if got := QueryName(b); got != "Squid.Site.Test" {
		t.Errorf("QueryName = %q", got)
	}
	m.Response = true
	b, _ = m.Pack()
	if got := QueryName(b); got != "" {
		t.Errorf("QueryName of a response = %q, want empty", got)
	}
	for _, bad := range [][]byte{nil, make([]byte, 11), append(b[:12:12], 70, 'a'), append(b[:12:12], 3, 'a')} {
		if got := QueryName(bad); got != "" {
			t.Errorf("QueryName(%x) = %q, want empty", bad, got)
		}
	}
}

// pair is a job-side user-space stack whose packets go through a bypass
// Device; packets the Device does not divert are counted as "sent to the
// gateway".
type pair struct {
	job     *userstack.Stack
	dev     *Device
	eng     *Engine
	toGW    atomic.Int64
	readErr chan error
}

func newPair(t *testing.T, b *control.Bypass, dial func(ctx context.Context, network, address string) (net.Conn, error)) *pair {
	t.Helper()
	job, err := userstack.New(userstack.Config{Addrs: []netip.Addr{jobAddr, jobAddr6}, DNS: []netip.Addr{dnsAddr}, MTU: 1420})
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{job: job, eng: NewEngine(slog.New(slog.DiscardHandler)), readErr: make(chan error, 1)}
	p.eng.dialHost = dial
	if err := p.eng.Update(b); err != nil {
		t.Fatal(err)
	}
	if p.dev, err = p.eng.Wrap(job, []netip.Addr{jobAddr, jobAddr6}, []netip.Addr{dnsAddr, dnsAddr6}, 1420); err != nil {
		t.Fatal(err)
	}
	go func() {
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, 65536+16)
		}
		sizes := make([]int, 64)
		for {
			n, err := p.dev.Read(bufs, sizes, 16)
			if err != nil {
				p.readErr <- err
				return
			}
			p.toGW.Add(int64(n))
		}
	}()
	t.Cleanup(func() {
		p.dev.Close()
		<-p.readErr
	})
	return p
}

func TestDevice(t *testing.T) {
	// The "site": a loopback echo server and a loopback DNS server.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 60 IN A 10.20.0.5")
		if r.Question[0].Qtype == dns.TypeAAAA {
			rr, _ = dns.NewRR(r.Question[0].Name + " 60 IN AAAA fd20::5")
		}
		m.Answer = append(m.Answer, rr)
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	defer srv.Shutdown()

	cfg := testConfig(t, pc.LocalAddr().String())
	var dmu sync.Mutex
	var dialledList []string
	dialled := func() []string {
		dmu.Lock()
		defer dmu.Unlock()
		return append([]string(nil), dialledList...)
	}
	p := newPair(t, bypassconf.ForJob(cfg.Bypass, cfg.Policy, "x"), func(ctx context.Context, network, address string) (net.Conn, error) {
		dmu.Lock()
		dialledList = append(dialledList, network+" "+address)
		dmu.Unlock()
		return net.Dial("tcp", l.Addr().String())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A local name: answered by the site resolver through the bypass.
	addrs, err := p.job.LookupHost(ctx, "squid.site.test")
	if err != nil || !slices.Contains(addrs, siteHost) || !slices.Contains(addrs, siteHost6) || len(addrs) != 2 {
		t.Fatalf("LookupHost(squid.site.test) = %v, %v; want %v and %v from the site resolver", addrs, err, siteHost, siteHost6)
	}
	// A bypassed destination of each family: echoed by the "site",
	// counted.
	msg := []byte("hello through the bypass")
	for i, dst := range []netip.AddrPort{netip.AddrPortFrom(siteHost, 80), netip.AddrPortFrom(siteHost6, 80)} {
		c, err := p.job.DialTCP(ctx, dst)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(msg)
		got := make([]byte, len(msg))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != string(msg) {
			t.Fatalf("echo from %s = %q, %v", dst, got, err)
		}
		c.Close()
		want := []string{"tcp4 10.20.0.5:80", "tcp6 [fd20::5]:80"}[:i+1]
		if d := dialled(); !slices.Equal(d, want) {
			t.Errorf("dialled %v, want %v", d, want)
		}
	}
	var rep control.BypassCount
	// Both directions: the echo may be counted in before the writer's
	// own count of what it sent.
	topology.Poll(2*time.Second, func() bool {
		r := p.eng.Report()
		if len(r) == 1 && r[0].BytesIn == 2*uint64(len(msg)) && r[0].BytesOut == 2*uint64(len(msg)) {
			rep = r[0]
			return true
		}
		return false
	})
	if rep != (control.BypassCount{Rule: "squid", Flows: 2, BytesOut: 2 * uint64(len(msg)), BytesIn: 2 * uint64(len(msg))}) {
		t.Errorf("report %+v, want squid: 2 flows, %d bytes each way", p.eng.Report(), 2*len(msg))
	}
	if n := p.toGW.Load(); n != 0 {
		t.Errorf("%d packets of bypassed flows went to the gateway", n)
	}

	// Denied by the gateway's policy: refused, not bypassed, not dialled.
	if _, err := p.job.DialTCP(ctx, netip.AddrPortFrom(siteHost, 3128)); err == nil {
		t.Error("10.20.0.5:3128 (bypass entry, denied by the policy): connected")
	}
	if d := dialled(); len(d) != 2 {
		t.Errorf("dialled %v after a denied flow", d)
	}
	// Not a bypass destination: the packets go to the gateway.
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	p.job.DialTCP(dctx, netip.AddrPortFrom(siteHost, 81))
	dcancel()
	if p.toGW.Load() == 0 {
		t.Error("a SYN to 10.20.0.5:81 (outside the entry) did not go to the gateway")
	}

	// A reload that removes the entries: new flows go to the gateway.
	if err := p.eng.Update(nil); err != nil {
		t.Fatal(err)
	}
	before := p.toGW.Load()
	dctx, dcancel = context.WithTimeout(ctx, 300*time.Millisecond)
	p.job.DialTCP(dctx, netip.AddrPortFrom(siteHost, 80))
	dcancel()
	if d := dialled(); p.toGW.Load() == before || len(d) != 2 {
		t.Errorf("after the entry was removed: %d packets to the gateway, dialled %v", p.toGW.Load()-before, d)
	}
}

func TestDiverts(t *testing.T) {
	cfg := testConfig(t, "10.20.0.53")
	s, err := Compile(bypassconf.ForJob(cfg.Bypass, cfg.Policy, "x"))
	if err != nil {
		t.Fatal(err)
	}
	d := &Device{job: [ipfamily.N]netip.Addr{jobAddr, jobAddr6}, dns: [ipfamily.N]netip.Addr{dnsAddr, dnsAddr6}}
	pkt := func(src, dst netip.Addr, proto byte, frag uint16, l4 []byte) []byte {
		if src.Is6() {
			// frag: a fragment header with that offset and M flag.
			b := make([]byte, 40, 48+len(l4))
			b[0] = 0x60
			b[6] = proto
			copy(b[8:24], src.AsSlice())
			copy(b[24:40], dst.AsSlice())
			if frag != 0 {
				b[6] = ipv6Fragment
				b = append(b, proto, 0, byte(frag>>8), byte(frag), 0, 0, 0, 1)
			}
			return append(b, l4...)
		}
		b := make([]byte, 20, 20+len(l4))
		b[0] = 0x45
		b[6], b[7] = byte(frag>>8), byte(frag)
		b[9] = proto
		copy(b[12:16], src.AsSlice())
		copy(b[16:20], dst.AsSlice())
		return append(b, l4...)
	}
	port := func(p uint16) []byte { return []byte{0x9c, 0x40, byte(p >> 8), byte(p), 0, 0, 0, 0} }
	q := new(dns.Msg)
	q.SetQuestion("squid.site.test.", dns.TypeA)
	local, _ := q.Pack()
	q.SetQuestion("example.org.", dns.TypeA)
	outside, _ := q.Pack()
	other := netip.MustParseAddr("10.20.0.6")
	for _, tc := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"tcp to the entry", pkt(jobAddr, siteHost, 6, 0, port(80)), true},
		{"tcp to an excluded port", pkt(jobAddr, siteHost, 6, 0, port(22)), false},
		{"udp to a tcp entry", pkt(jobAddr, siteHost, 17, 0, port(80)), false},
		{"spoofed source", pkt(netip.MustParseAddr("100.64.0.3"), siteHost, 6, 0, port(80)), false},
		{"another host", pkt(jobAddr, other, 6, 0, port(80)), false},
		{"fragment to the entry's host", pkt(jobAddr, siteHost, 17, 0x2000, port(22)), true},
		{"later fragment", pkt(jobAddr, siteHost, 6, 0x0010, nil), true},
		{"icmp to a tcp entry", pkt(jobAddr, siteHost, 1, 0, []byte{8, 0, 0, 0}), false},
		{"truncated", pkt(jobAddr, siteHost, 6, 0, []byte{0}), false},
		{"local dns query", pkt(jobAddr, dnsAddr, 17, 0, append(port(53), local...)), true},
		{"other dns query", pkt(jobAddr, dnsAddr, 17, 0, append(port(53), outside...)), false},
		{"local query over tcp", pkt(jobAddr, dnsAddr, 6, 0, append(port(53), local...)), false},
		{"ipv6: tcp to the entry", pkt(jobAddr6, siteHost6, 6, 0, port(80)), true},
		{"ipv6: tcp to an excluded port", pkt(jobAddr6, siteHost6, 6, 0, port(22)), false},
		{"ipv6: spoofed source", pkt(netip.MustParseAddr("fd00:a1::6440:3"), siteHost6, 6, 0, port(80)), false},
		{"ipv6: the job's IPv4 address's entry, over IPv6", pkt(jobAddr6, netip.MustParseAddr("::ffff:10.20.0.6"), 6, 0, port(80)), false},
		{"ipv6: fragment to the entry's host", pkt(jobAddr6, siteHost6, 17, 0x0001, port(22)), true},
		{"ipv6: icmpv6 to a tcp entry", pkt(jobAddr6, siteHost6, 58, 0, []byte{128, 0, 0, 0}), false},
		{"ipv6: hop-by-hop header", pkt(jobAddr6, siteHost6, 0, 0, append([]byte{6, 0, 0, 0, 0, 0, 0, 0}, port(80)...)), false},
		{"ipv6: local dns query", pkt(jobAddr6, dnsAddr6, 17, 0, append(port(53), local...)), true},
		{"ipv6: other dns query", pkt(jobAddr6, dnsAddr6, 17, 0, append(port(53), outside...)), false},
		{"ipv6: a query to the IPv4 resolver's address", pkt(jobAddr6, netip.MustParseAddr("::ffff:100.64.0.1"), 17, 0, append(port(53), local...)), false},
		{"not ip", append([]byte{0x50}, make([]byte, 60)...), false},
	} {
		if got := d.diverts(s, tc.pkt); got != tc.want {
			t.Errorf("%s: diverts = %v, want %v", tc.name, got, tc.want)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { d.diverts(s, pkt(jobAddr, other, 6, 0, port(80))) }); allocs > 1 {
		t.Errorf("diverts allocates %v times per non-bypass packet", allocs)
	}
}

func TestDialRefusals(t *testing.T) {
	cfg := testConfig(t, "10.20.0.53")
	e := NewEngine(slog.New(slog.DiscardHandler))
	e.dialHost = func(ctx context.Context, network, address string) (net.Conn, error) {
		t.Errorf("dialled %s %s", network, address)
		return nil, errors.New("no")
	}
	if err := e.Update(bypassconf.ForJob(cfg.Bypass, cfg.Policy, "x")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := e.Dial(ctx, "tcp4", netip.AddrPortFrom(siteHost, 22)); !errors.Is(err, ErrNotBypassed) {
		t.Errorf("excluded port: %v, want ErrNotBypassed", err)
	}
	if _, err := e.Dial(ctx, "tcp4", netip.AddrPortFrom(siteHost, 3128)); !errors.Is(err, ErrDenied) {
		t.Errorf("denied by the policy: %v, want ErrDenied", err)
	}
	if _, ok, _ := e.LookupHost(ctx, "example.org"); ok {
		t.Error("LookupHost took a name outside the local domains")
	}
}

// TestCompileEmpty checks that the lease watch's empty bypass ("none",
// with a zero policy) compiles to a set that bypasses nothing, instead of
// being refused for its empty policy default.
func TestCompileEmpty(t *testing.T) {
	s, err := Compile(&control.Bypass{})
	if err != nil {
		t.Fatalf("Compile(empty bypass): %v, want no error", err)
	}
	if !s.IsEmpty() {
		t.Errorf("Compile(empty bypass) is not empty: %v", s.Rules())
	}
}

// TestDeviceUDP sends a job's UDP datagram to a destination an any-protocol
// entry bypasses (token cms's) through the Device: the divert stack dials
// it with Engine.Dial and relays the echo both ways. An ICMP echo to the
// same destination is not diverted (the divert stack would answer it
// itself).
func TestDeviceUDP(t *testing.T) {
	echo, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := echo.ReadFrom(buf)
			if err != nil {
				return
			}
			echo.WriteTo(buf[:n], from)
		}
	}()
	cfg := testConfig(t, "127.0.0.1:53")
	var dialled atomic.Pointer[string]
	p := newPair(t, bypassconf.ForJob(cfg.Bypass, cfg.Policy, "cms"), func(ctx context.Context, network, address string) (net.Conn, error) {
		s := network + " " + address
		dialled.Store(&s)
		return net.Dial("udp", echo.LocalAddr().String())
	})
	dst := netip.MustParseAddrPort("10.30.0.7:9999")
	c, err := p.job.DialUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := []byte("a datagram through the bypass")
	got := make([]byte, 100)
	var n int
	for i := 0; i < 20 && n == 0; i++ { // UDP: retry a lost first datagram
		c.Write(msg)
		c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
		n, _ = c.Read(got)
	}
	if string(got[:n]) != string(msg) {
		t.Fatalf("echo from %s = %q, want %q", dst, got[:n], msg)
	}
	if d := dialled.Load(); d == nil || *d != "udp4 10.30.0.7:9999" {
		t.Errorf("dialled %v, want udp4 10.30.0.7:9999", d)
	}
	if r := p.eng.Report(); len(r) != 1 || r[0].Rule != "cms-storage" || r[0].Flows != 1 {
		t.Errorf("report %+v, want one cms-storage flow", r)
	}
	if n := p.toGW.Load(); n != 0 {
		t.Errorf("%d packets of the bypassed flow went to the gateway", n)
	}
	icmp := make([]byte, 28)
	icmp[0], icmp[9], icmp[20] = 0x45, 1, 8
	copy(icmp[12:16], jobAddr.AsSlice())
	copy(icmp[16:20], dst.Addr().AsSlice())
	if !p.dev.diverts(p.eng.Set(), icmp) {
		t.Error("an ICMP echo request to an any-protocol entry is not diverted")
	}
	icmp[20] = 0 // an echo reply
	if p.dev.diverts(p.eng.Set(), icmp) {
		t.Error("an ICMP echo reply to an any-protocol entry is diverted")
	}
}

// TestEchoReply checks the echo reply packets the pinger rebuilds for the
// job (checksums, the job's id, addresses) and what it takes for an echo
// request.
func TestEchoReply(t *testing.T) {
	site4, site6 := netip.MustParseAddr("10.30.0.7"), siteHost6
	for _, tc := range []struct {
		f        *ipfamily.Family
		job, dst netip.Addr
	}{{ipfamily.V4, jobAddr, site4}, {ipfamily.V6, jobAddr6, site6}} {
		// What a ping socket returns: the reply with the socket's id.
		msg := []byte{tc.f.EchoReply, 0, 0xde, 0xad, 0x12, 0x34, 0, 7, 'h', 'i', '!'}
		pkt := echoReply(tc.f, pingKey{dst: tc.dst, id: 0xbeef}, tc.job, msg)
		if pkt == nil {
			t.Fatalf("%s: no reply", tc.dst)
		}
		if ipfamily.OfPacket(pkt) != tc.f || tc.f.Addr(pkt, tc.f.SrcOff) != tc.dst || tc.f.Addr(pkt, tc.f.DstOff) != tc.job || pkt[tc.f.ProtoOff] != tc.f.ICMP {
			t.Fatalf("%s: reply %x: wrong family, addresses or protocol", tc.dst, pkt)
		}
		m := pkt[tc.f.HeaderLen:]
		if id, seq := binary.BigEndian.Uint16(m[4:6]), binary.BigEndian.Uint16(m[6:8]); id != 0xbeef || seq != 7 || string(m[8:]) != "hi!" {
			t.Errorf("%s: reply id %#x seq %d data %q, want 0xbeef 7 hi!", tc.dst, id, seq, m[8:])
		}
		var xsum uint16
		src, dst := tcpip.AddrFromSlice(tc.dst.AsSlice()), tcpip.AddrFromSlice(tc.job.AsSlice())
		if tc.f == ipfamily.V4 {
			if !header.IPv4(pkt).IsChecksumValid() {
				t.Errorf("%s: bad IPv4 header checksum", tc.dst)
			}
		} else {
			xsum = header.PseudoHeaderChecksum(header.ICMPv6ProtocolNumber, src, dst, uint16(len(m)))
		}
		if got := checksum.Checksum(m, xsum); got != 0xffff {
			t.Errorf("%s: bad ICMP checksum (sum %#x)", tc.dst, got)
		}
		// The job's request: taken; a reply or other message: not.
		req := append([]byte(nil), pkt...)
		req[tc.f.HeaderLen] = tc.f.EchoRequest
		if f, off, ok := echoRequest(req); !ok || f != tc.f || off != tc.f.HeaderLen {
			t.Errorf("%s: echoRequest(request) = %v %d %v", tc.dst, f, off, ok)
		}
		if _, _, ok := echoRequest(pkt); ok {
			t.Errorf("%s: echoRequest(reply) = true", tc.dst)
		}
	}
	if echoReply(ipfamily.V4, pingKey{dst: netip.MustParseAddr("10.30.0.7")}, jobAddr, []byte{3, 1, 0, 0, 0, 0, 0, 0}) != nil {
		t.Error("echoReply of a destination unreachable: not nil")
	}
}

// TestDeviceCloseEndsFlows closes the Device while a bypassed TCP flow is
// open and its host side silent: Close ends the flow (both sockets) and
// returns.
func TestDeviceCloseEndsFlows(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c // held open, silent
		}
	}()
	cfg := testConfig(t, "127.0.0.1:53")
	p := newPair(t, bypassconf.ForJob(cfg.Bypass, cfg.Policy, "x"), func(ctx context.Context, network, address string) (net.Conn, error) {
		return net.Dial("tcp", l.Addr().String())
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.job.DialTCP(ctx, netip.AddrPortFrom(siteHost, 80))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var host net.Conn
	select {
	case host = <-accepted:
		defer host.Close()
	case <-ctx.Done():
		t.Fatal("the bypassed flow was not dialled")
	}
	done := make(chan struct{})
	go func() { p.dev.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Device.Close did not return with a bypassed flow open")
	}
	host.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := host.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("host side of the flow after Close: read %v, want EOF (closed)", err)
	}
}
