// SPDX-License-Identifier: MIT

package kernel

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

var testRules6 = ruleset{
	tun:     "airlock0",
	tunnels: [2]netip.Prefix{netip.MustParsePrefix("100.64.0.1/16"), netip.MustParsePrefix("fd00:a1::1/64")},
	egress:  [2]netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8:ff::1")},
	own:     netip.MustParsePrefix("2001:db8:77::/64"),
}

// pkt is a packet for evalRules.
type pkt struct {
	nfproto, l4proto byte
	src, dst         netip.Addr
	dport            uint16
	icmpType         byte
	// sets holds the elements of named sets (token scopes, own6).
	sets map[string][][]byte
	// srcB, dstB are src and dst as bytes (evalRules fills them in).
	srcB, dstB []byte
}

// evalRules runs rules the way nftables would for p, as far as the
// expressions of this package's filter chains go (no NAT, no state: ct
// state is new), and returns the verdict of the first rule that reaches
// one, with that rule's index; ok is false if none does.
func evalRules(t *testing.T, rules [][]expr.Any, p pkt) (v *expr.Verdict, idx int, ok bool) {
	t.Helper()
	p.srcB, p.dstB = p.src.AsSlice(), p.dst.AsSlice()
	for i, r := range rules {
		if v := evalRule(t, r, p); v != nil {
			return v, i, true
		}
	}
	return nil, -1, false
}

func evalRule(t *testing.T, r []expr.Any, p pkt) *expr.Verdict {
	t.Helper()
	if p.srcB == nil {
		p.srcB, p.dstB = p.src.AsSlice(), p.dst.AsSlice()
	}
	var regs [32][]byte
	var and [16]byte
	for _, e := range r {
		switch e := e.(type) {
		case *expr.Meta:
			switch e.Key {
			case expr.MetaKeyNFPROTO:
				regs[e.Register] = []byte{p.nfproto}
			case expr.MetaKeyL4PROTO:
				regs[e.Register] = []byte{p.l4proto}
			default:
				t.Fatalf("meta key %v", e.Key)
			}
		case *expr.Payload:
			var b []byte
			f := v4Family
			if p.nfproto == unix.NFPROTO_IPV6 {
				f = v6Family
			}
			// Addresses: any bytes of one of them.
			in := func(at int) bool {
				return int(e.Offset) >= at && int(e.Offset+e.Len) <= at+f.Bits/8
			}
			switch {
			case e.Base == expr.PayloadBaseNetworkHeader && in(f.SrcOff):
				b = p.srcB[int(e.Offset)-f.SrcOff:][:e.Len]
			case e.Base == expr.PayloadBaseNetworkHeader && in(f.DstOff):
				b = p.dstB[int(e.Offset)-f.DstOff:][:e.Len]
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
				b = []byte{byte(p.dport >> 8), byte(p.dport)}
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 0 && e.Len == 1:
				b = []byte{p.icmpType}
			default:
				t.Fatalf("payload %+v for %+v", e, p)
			}
			regs[e.DestRegister] = b
		case *expr.Bitwise:
			in := regs[e.SourceRegister]
			out := and[:len(in)]
			for i := range in {
				out[i] = in[i]&e.Mask[i] ^ e.Xor[i]
			}
			regs[e.DestRegister] = out
		case *expr.Cmp:
			eq := bytes.Equal(regs[e.Register], e.Data)
			if eq != (e.Op == expr.CmpOpEq) {
				return nil
			}
		case *expr.Range:
			v := regs[e.Register]
			if bytes.Compare(v, e.FromData) < 0 || bytes.Compare(v, e.ToData) > 0 {
				return nil
			}
		case *expr.Lookup:
			in := false
			for _, el := range p.sets[e.SetName] {
				in = in || bytes.Equal(el, regs[e.SourceRegister])
			}
			if in == e.Invert {
				return nil
			}
		case *expr.Ct:
			if e.Key != expr.CtKeySTATE {
				t.Fatalf("ct key %v", e.Key)
			}
			regs[e.Register] = []byte{byte(expr.CtStateBitNEW), 0, 0, 0} // native endian, little
		case *expr.Counter, *expr.Immediate, *expr.NAT:
		case *expr.Verdict:
			return e
		default:
			t.Fatalf("expression %T", e)
		}
	}
	return nil
}

// kernelVerdict evaluates floor6 and egress_policy for a new flow to dst
// and returns the verdict as policy.Decide would name it.
func kernelVerdict(t *testing.T, floor [][]expr.Any, c *compiledPolicy, proto policy.Proto, dst netip.Addr, port uint16) policy.Verdict {
	t.Helper()
	p := pkt{nfproto: unix.NFPROTO_IPV6, src: netip.MustParseAddr("fd00:a1::7"), dst: dst, dport: port}
	switch proto {
	case policy.ProtoTCP:
		p.l4proto = unix.IPPROTO_TCP
	case policy.ProtoUDP:
		p.l4proto = unix.IPPROTO_UDP
	case policy.ProtoICMP:
		p.l4proto, p.icmpType = unix.IPPROTO_ICMPV6, 128
	}
	if v, _, ok := evalRules(t, floor, p); ok {
		if v.Chain != chainFloor {
			t.Fatalf("floor6 verdict %+v", v)
		}
		return policy.Verdict{Action: policy.Deny, Rule: policy.RuleFloor}
	}
	var main [][]expr.Any
	for _, pr := range c.main {
		main = append(main, pr.exprs)
	}
	v, i, ok := evalRules(t, main, p)
	if !ok || v.Kind == expr.VerdictReturn {
		return policy.Verdict{Action: policy.Allow}
	}
	if v.Chain != chainPolicyDeny {
		t.Fatalf("egress_policy verdict %+v", v)
	}
	return policy.Verdict{Action: policy.Deny, Rule: c.main[i].tag}
}

// randomIn returns a random address of m.
func randomIn(rng *rand.Rand, m mrange) netip.Addr {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.Uint32())&^m.mask[i] | m.val[i]
	}
	return netip.AddrFrom16(b)
}

// TestPolicy6MatchesDecide compiles IPv6 policies and checks, for
// addresses in and around every range of the built-in list, its embedded
// images and the floor, that the kernel's rules (floor6, egress_policy)
// give policy.Decide's verdict: the same action, and for denials by the
// built-in list the same rule.
func TestPolicy6MatchesDecide(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 16))
	var dsts []netip.Addr
	var around []mrange
	around = append(around, protected6()...)
	around = append(around, testRules6.floor6()...)
	for _, e := range embeddings() {
		for _, p := range []string{"8.8.8.0/24", "0.0.0.0/0", "192.0.2.0/24"} {
			around = append(around, imageRange(e, netip.MustParsePrefix(p), ""))
		}
	}
	for _, m := range around {
		for i := 0; i < 4; i++ {
			dsts = append(dsts, randomIn(rng, m))
		}
		dsts = append(dsts, netip.AddrFrom16(m.val))
	}
	for i := 0; i < 64; i++ {
		dsts = append(dsts, randomIn(rng, prefixRange(netip.MustParsePrefix("2000::/3"), "")))
	}
	pf := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	policies := map[string]*policy.Policy{
		"empty":       {},
		"deny-all":    {Default: policy.Deny},
		"allow-all":   {Default: policy.Deny, Rules: []policy.Rule{{Name: "all", Action: policy.Allow, To: pf("::/0")}}},
		"allow-glob":  {Default: policy.Deny, Rules: []policy.Rule{{Name: "g", Action: policy.Allow, To: pf("2000::/3")}}},
		"allow-23":    {Default: policy.Deny, Rules: []policy.Rule{{Name: "x", Action: policy.Allow, To: pf("2001::/23", "2001::/32")}}},
		"allow-nat64": {Default: policy.Deny, Rules: []policy.Rule{{Name: "n", Action: policy.Allow, To: pf("64:ff9b::/96", "64:ff9b::a9fe:a9fe/128", "64:ff9b::a00:0/104")}}},
		"allow-teredo": {Default: policy.Deny, Rules: []policy.Rule{{Name: "t", Action: policy.Allow,
			To: pf("2001::/32", "2001:0:a00::/40", "2001:0:808:808::f5ff:0/112")}}},
		"allow-private": {Rules: []policy.Rule{
			{Name: "ula", Action: policy.Allow, To: pf("fc00::/7", "fe80::/10", "2002:a00::/24")},
			{Name: "no-smtp", Action: policy.Deny, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}}},
			{Name: "meta", Action: policy.Allow, To: pf("fd00:ec2::254/128")},
		}},
		"icmp-only": {Default: policy.Deny, Rules: []policy.Rule{{Name: "ping", Action: policy.Allow, Proto: policy.ProtoICMP}}},
		"web": {Default: policy.Deny, Rules: []policy.Rule{
			{Name: "deny-doc", Action: policy.Deny, To: pf("2001:db8:dead::/48")},
			{Name: "web", Action: policy.Allow, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 443, Hi: 443}, {Lo: 8000, Hi: 8100}}},
		}},
	}
	subnets := []netip.Prefix{testRules6.tunnels[0].Masked(), testRules6.tunnels[1].Masked()}
	floor := testRules6.floor6Rules()
	checked := 0
	for name, p := range policies {
		if err := p.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		c := testRules6.compilePolicy(table(), p, 1)
		for _, dst := range dsts {
			if testRules6.tunnels[1].Masked().Contains(dst) || testRules6.own.Contains(dst) || dst.Is4In6() {
				continue // the kernel's own floor: see TestFloor6
			}
			for _, fl := range []struct {
				proto policy.Proto
				port  uint16
			}{{policy.ProtoTCP, 443}, {policy.ProtoTCP, 25}, {policy.ProtoICMP, 0}} {
				want := p.Decide(policy.Flow{Proto: fl.proto, Dst: dst, Port: fl.port, Tunnels: subnets})
				got := kernelVerdict(t, floor, c, fl.proto, dst, fl.port)
				checked++
				if got.Action != want.Action || got.Action == policy.Deny && strings.HasPrefix(want.Rule, "builtin") && got.Rule != want.Rule {
					t.Errorf("%s: %v %s:%d: kernel %v (%s), Decide %v (%s)", name, fl.proto, dst, fl.port, got.Action, got.Rule, want.Action, want.Rule)
				}
			}
		}
	}
	t.Logf("%d flows checked, %d rules in the allow-all policy", checked, len(testRules6.compilePolicy(table(), policies["allow-all"], 1).main))
}

// TestFloor6 checks the IPv6 floor: what the list and the tunnel subnets
// close, embedded forms of the IPv4 floor, the IPv4-mapped range and the
// routed prefix.
func TestFloor6(t *testing.T) {
	for _, tc := range []struct {
		dst   string
		floor bool
	}{
		{"::1", true},
		{"::", true},
		{"ff02::1", true},
		{"ff0e::1", true},
		{"fd00:a1::1", true},             // the gateway's tunnel address
		{"fd00:a1::99", true},            // another job
		{"2001:db8:77::5", true},         // a job's own address
		{"::ffff:8.8.8.8", true},         // IPv4-mapped: IPv4 goes over IPv4
		{"64:ff9b::7f00:1", true},        // NAT64 of 127.0.0.1
		{"64:ff9b::6440:5", true},        // NAT64 of the tunnel subnet
		{"64:ff9b:1:2:3:4:e000:1", true}, // local NAT64 of 224.0.0.1
		{"2002:7f00:1::", true},          // 6to4 of loopback
		{"2001:0:7f00:1::", true},        // Teredo server 127.0.0.1
		{"2001:0:808:808::80ff:fffe", true},
		{"::7f00:1", true}, // IPv4-compatible loopback
		{"2001:db8::1", false},
		{"64:ff9b::808:808", false},
		{"fd00:a2::1", false}, // ULA: protected, not floor
		{"fe80::1", false},
		{"2001:0:808:808::f7f7:f7f7", false},
	} {
		p := pkt{nfproto: unix.NFPROTO_IPV6, l4proto: unix.IPPROTO_TCP, dst: netip.MustParseAddr(tc.dst), dport: 80}
		_, _, got := evalRules(t, testRules6.floor6Rules(), p)
		if got != tc.floor {
			t.Errorf("%s: floor %v, want %v", tc.dst, got, tc.floor)
		}
	}
}

func TestMrange(t *testing.T) {
	e := policy.Embedding{Prefix: netip.MustParsePrefix("2001::/32"), Off: 96, Inverted: true}
	m := imageRange(e, netip.MustParsePrefix("10.0.0.0/8"), "x")
	if got := m.spec(); got != 104 {
		t.Errorf("spec: got %d, want 104", got)
	}
	for _, tc := range []struct {
		a  string
		in bool
	}{{"2001:0:808:808::f5ff:fffe", true}, {"2001:0:1:2:3:4:f500:0", true}, {"2001:0:808:808::a00:1", false}, {"2001:1::f5ff:fffe", false}} {
		if got := m.contains(netip.MustParseAddr(tc.a)); got != tc.in {
			t.Errorf("%s in Teredo client image of 10/8: got %v, want %v", tc.a, got, tc.in)
		}
	}
	p := prefixRange(netip.MustParsePrefix("2001::/23"), "")
	if !m.within(p) || p.within(m) || !m.meets(p) {
		t.Errorf("within/meets of the Teredo image and 2001::/23")
	}
	q := prefixRange(netip.MustParsePrefix("2001:0:a00::/40"), "")
	if !q.meets(m) || q.within(m) || m.within(q) {
		t.Errorf("a Teredo server prefix and a client image overlap without nesting")
	}
	if got := q.and(m).spec(); got != 104 {
		t.Errorf("intersection spec: got %d", got)
	}
}

func TestNATRules6(t *testing.T) {
	block := portblock.Range{Lo: 20256, Hi: 20511}
	ula := netip.MustParseAddr("fd00:a1::7")
	egress := func(r ruleset, e forward.Egress) jobEgress {
		return r.egressOf(forward.Job{Addrs: []netip.Addr{ula}, Egress: []forward.Egress{e}}, v6Family)
	}
	rules := testRules6.natRules(ula, egress(testRules6, forward.Egress{Addr: netip.IPv6Unspecified(), Block: block}))
	if len(rules) != 3 {
		t.Fatalf("shared job: %d rules, want 3", len(rules))
	}
	for i, r := range rules {
		nat, imm := natOf(t, r)
		if nat.Family != unix.NFPROTO_IPV6 || !bytes.Equal(imm[nat.RegAddrMin], testRules6.egress[1].AsSlice()) {
			t.Errorf("rule %d: nat %+v to %x, want ipv6 snat to %v", i, nat, imm[nat.RegAddrMin], testRules6.egress[1])
		}
		if (nat.RegProtoMin != 0) != (i < 2) {
			t.Errorf("rule %d: port range %v", i, nat.RegProtoMin != 0)
		}
	}
	given := netip.MustParseAddr("2001:db8:ff::2")
	rules = testRules6.natRules(ula, egress(testRules6, forward.Egress{Addr: given, Block: block}))
	if nat, imm := natOf(t, rules[0]); len(rules) != 3 || nat.RegProtoMin == 0 || !bytes.Equal(imm[nat.RegAddrMin], given.AsSlice()) {
		t.Errorf("given egress: %d rules, nat %+v to %x, want %v with the block", len(rules), nat, imm[nat.RegAddrMin], given)
	}
	own := netip.MustParseAddr("2001:db8:77::99")
	rules = testRules6.natRules(ula, egress(testRules6, forward.Egress{Addr: own, Own: true}))
	if len(rules) != 1 {
		t.Fatalf("one-to-one job: %d rules, want 1", len(rules))
	}
	if nat, imm := natOf(t, rules[0]); nat.RegProtoMin != 0 || !bytes.Equal(imm[nat.RegAddrMin], own.AsSlice()) {
		t.Errorf("one-to-one: nat %+v to %x, want %v without ports", nat, imm[nat.RegAddrMin], own)
	}
	noEgress := testRules6
	noEgress.egress[1] = netip.Addr{}
	rules = noEgress.natRules(ula, egress(noEgress, forward.Egress{Addr: netip.IPv6Unspecified(), Block: block}))
	if len(rules) != 3 {
		t.Fatalf("no IPv6 egress address: %d rules, want 3", len(rules))
	}
	for i, r := range rules {
		m, ok := r[len(r)-1].(*expr.Masq)
		if !ok || m.ToPorts != (i < 2) {
			t.Errorf("no IPv6 egress address, rule %d: %T %+v, want masquerade (to the block: %v)", i, r[len(r)-1], m, i < 2)
		}
	}
}

// TestFromJobs6 runs from_jobs' rules for IPv6 packets.
func TestFromJobs6(t *testing.T) {
	rules := testRules6.fromJobsRules()
	for _, tc := range []struct {
		name string
		r    ruleset
		src  string
		own  bool
		want string // verdict kind or chain
	}{
		{"job", testRules6, "fd00:a1::7", false, chainFloor6},
		{"job with an own address", testRules6, "fd00:a1::8", true, chainFloor6},
		{"spoofed", testRules6, "2001:db8:1::7", false, "drop"},
		{"no v6", testRules, "fd00:a1::7", false, "drop"},
	} {
		rules = tc.r.fromJobsRules()
		p := pkt{nfproto: unix.NFPROTO_IPV6, l4proto: unix.IPPROTO_TCP, src: netip.MustParseAddr(tc.src), dst: netip.MustParseAddr("2001:db8:1::1"), dport: 443}
		if tc.own {
			p.sets = map[string][][]byte{setOwn: {p.src.AsSlice()}}
		}
		v, _, ok := evalRules(t, rules, p)
		got := "none"
		if ok {
			got = v.Chain
			if got == "" {
				got = fmt.Sprint(map[expr.VerdictKind]string{expr.VerdictDrop: "drop", expr.VerdictAccept: "accept"}[v.Kind])
			}
		}
		if got != tc.want {
			t.Errorf("%s: %s → %s", tc.name, tc.src, got)
		}
	}
}

func TestExposeRules6(t *testing.T) {
	ula := netip.MustParseAddr("fd00:a1::7")
	job := forward.Job{Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.7"), ula}}
	own := netip.MustParseAddr("2001:db8:77::7")
	for _, tc := range []struct {
		name string
		at   netip.Addr
		port uint16 // the public port (at an own address the gateway gives the job's own)
	}{
		{"shared", testRules6.egress[1], 20300},
		{"shared, the configured address", netip.IPv6Unspecified(), 20300},
		{"own address", own, 8080},
	} {
		ex := []forward.Exposure{{Proto: ipproto.TCP, JobPort: 8080, PublicPort: tc.port, PublicAddr: tc.at}}
		dnat, err := testRules6.exposeRules(job, ex)
		if err != nil || len(dnat) != 1 {
			t.Fatalf("%s: %d rules, %v", tc.name, len(dnat), err)
		}
		// Strip iifname != TUN (not in pkt).
		r := append(append([]expr.Any(nil), dnat[0][:2]...), dnat[0][4:]...)
		dst := tc.at
		if dst.IsUnspecified() {
			dst = testRules6.egress[1]
		}
		p := pkt{nfproto: unix.NFPROTO_IPV6, l4proto: unix.IPPROTO_TCP, src: netip.MustParseAddr("2001:db8:1::1"), dst: dst, dport: tc.port}
		// Every compare must pass to reach the appended verdict.
		if v := evalRule(t, append(r, &expr.Verdict{Kind: expr.VerdictAccept}), p); v == nil {
			t.Errorf("%s: the rule does not match [%v]:%d", tc.name, dst, tc.port)
		}
		p.dport = 20301
		if v := evalRule(t, append(r, &expr.Verdict{Kind: expr.VerdictAccept}), p); v != nil {
			t.Errorf("%s: the rule matches another port", tc.name)
		}
		nat, imm := natOf(t, dnat[0])
		if nat.Type != expr.NATTypeDestNAT || nat.Family != unix.NFPROTO_IPV6 || !bytes.Equal(imm[1], ula.AsSlice()) || !bytes.Equal(imm[2], []byte{8080 >> 8, 8080 & 0xff}) {
			t.Errorf("%s: dnat %+v %v", tc.name, nat, imm)
		}
	}
	if _, err := testRules6.exposeRules(job, []forward.Exposure{{Proto: ipproto.Proto(132), JobPort: 1, PublicPort: 1, PublicAddr: own}}); err == nil {
		t.Error("sctp exposure accepted")
	}
}

func TestValidate6(t *testing.T) {
	for _, tt := range []struct {
		name string
		mod  func(*ruleset)
		ok   bool
	}{
		{"ok", func(*ruleset) {}, true},
		{"no egress6", func(r *ruleset) { r.egress[1] = netip.Addr{} }, true},
		{"v4 as addr6", func(r *ruleset) { r.tunnels[1] = netip.MustParsePrefix("10.0.0.1/24") }, false},
		{"mapped egress6", func(r *ruleset) { r.egress[1] = netip.MustParseAddr("::ffff:1.2.3.4") }, false},
		{"prefix overlaps tunnel", func(r *ruleset) { r.own = netip.MustParsePrefix("fd00:a1::/48") }, false},
		{"prefix without v6", func(r *ruleset) { r.tunnels[1] = netip.Prefix{}; r.egress[1] = netip.Addr{} }, false},
	} {
		r := testRules6
		tt.mod(&r)
		if err := r.validate(); (err == nil) != tt.ok {
			t.Errorf("%s: validate: %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
	r := testRules6
	for _, tt := range []struct {
		name   string
		egress forward.Egress
		ok     bool
	}{
		{"shared", forward.Egress{Addr: netip.IPv6Unspecified()}, true},
		{"own address", forward.Egress{Addr: netip.MustParseAddr("2001:db8:77::7"), Own: true}, true},
		{"own address outside the prefix", forward.Egress{Addr: netip.MustParseAddr("2001:db8:1::7"), Own: true}, false},
		{"shared address inside the own prefix", forward.Egress{Addr: netip.MustParseAddr("2001:db8:77::7")}, false},
		{"shared, given egress", forward.Egress{Addr: netip.MustParseAddr("2001:db8:1::7")}, true},
	} {
		j := forward.Job{Addrs: []netip.Addr{netip.MustParseAddr("fd00:a1::7")}, Egress: []forward.Egress{tt.egress}}
		if err := r.checkJob(j); (err == nil) != tt.ok {
			t.Errorf("%s: checkJob: %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}
