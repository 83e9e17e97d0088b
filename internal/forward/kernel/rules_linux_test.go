// SPDX-License-Identifier: MIT

package kernel

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

var testRules = ruleset{
	tun:     "airlock0",
	tunnels: [2]netip.Prefix{netip.MustParsePrefix("100.64.0.1/16")},
	egress:  [2]netip.Addr{netip.MustParseAddr("203.0.113.1")},
}

// v4 returns r's IPv4 tunnel address and subnet.
func (r ruleset) v4() netip.Prefix { return r.tunnels[0] }

func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		r    ruleset
		ok   bool
	}{
		{"ok", testRules, true},
		{"no egress", ruleset{tun: "a", tunnels: testRules.tunnels}, false},
		{"unspecified egress", ruleset{tun: "a", tunnels: testRules.tunnels, egress: [2]netip.Addr{netip.IPv4Unspecified()}}, false},
		{"v6 egress as v4", ruleset{tun: "a", tunnels: testRules.tunnels, egress: [2]netip.Addr{netip.MustParseAddr("2001:db8::1")}}, false},
		{"v6 tunnel as v4", ruleset{tun: "a", tunnels: [2]netip.Prefix{netip.MustParsePrefix("fd00::1/64")}, egress: testRules.egress}, false},
		{"no v4 tunnel", ruleset{tun: "a", tunnels: [2]netip.Prefix{1: netip.MustParsePrefix("fd00::1/64")}, egress: testRules.egress}, false},
		{"long name", ruleset{tun: strings.Repeat("x", 16), tunnels: testRules.tunnels, egress: testRules.egress}, false},
		{"no name", ruleset{tunnels: testRules.tunnels, egress: testRules.egress}, false},
	} {
		if err := tt.r.validate(); (err == nil) != tt.ok {
			t.Errorf("%s: validate: got %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// natOf returns the NAT expression of a rule and the immediate values it
// loads, by register.
func natOf(t *testing.T, rule []expr.Any) (*expr.NAT, map[uint32][]byte) {
	t.Helper()
	imm := map[uint32][]byte{}
	var nat *expr.NAT
	for _, e := range rule {
		switch e := e.(type) {
		case *expr.Immediate:
			imm[e.Register] = e.Data
		case *expr.NAT:
			nat = e
		}
	}
	if nat == nil {
		t.Fatalf("rule has no nat expression: %v", rule)
	}
	return nat, imm
}

func l4Of(rule []expr.Any) (byte, bool) {
	for i, e := range rule {
		if m, ok := e.(*expr.Meta); ok && m.Key == expr.MetaKeyL4PROTO && i+1 < len(rule) {
			return rule[i+1].(*expr.Cmp).Data[0], true
		}
	}
	return 0, false
}

func TestJobRules(t *testing.T) {
	job := netip.MustParseAddr("100.64.0.7")
	block := portblock.Range{Lo: 20256, Hi: 20511}
	rules := testRules.natRules(job, jobEgress{addr: testRules.egress[0], block: block})
	if got, want := len(rules), 3; got != want {
		t.Fatalf("job rules: got %d, want %d", got, want)
	}
	for i, want := range []struct {
		proto byte
		ports bool
	}{{unix.IPPROTO_TCP, true}, {unix.IPPROTO_UDP, true}, {0, false}} {
		r := rules[i]
		p, has := l4Of(r)
		if has != (want.proto != 0) || p != want.proto {
			t.Errorf("rule %d: l4proto %d (matched %v), want %d", i, p, has, want.proto)
		}
		// The source match is the job's /32: payload at offset 12, no mask.
		var saddr []byte
		for j, e := range r {
			if pl, ok := e.(*expr.Payload); ok && pl.Base == expr.PayloadBaseNetworkHeader && pl.Offset == 12 {
				if _, masked := r[j+1].(*expr.Bitwise); masked {
					t.Errorf("rule %d: job address match is masked", i)
				}
				saddr = r[j+1].(*expr.Cmp).Data
			}
		}
		if a := job.As4(); string(saddr) != string(a[:]) {
			t.Errorf("rule %d: saddr %v, want %v", i, saddr, job)
		}
		nat, imm := natOf(t, r)
		if nat.Type != expr.NATTypeSourceNAT || nat.Family != unix.NFPROTO_IPV4 {
			t.Errorf("rule %d: nat %+v, want ipv4 snat", i, nat)
		}
		if e := testRules.egress[0].As4(); string(imm[nat.RegAddrMin]) != string(e[:]) {
			t.Errorf("rule %d: snat address %v, want %v", i, imm[nat.RegAddrMin], testRules.egress[0])
		}
		if (nat.RegProtoMin != 0) != want.ports {
			t.Errorf("rule %d: port range present %v, want %v", i, nat.RegProtoMin != 0, want.ports)
		}
		if want.ports {
			lo, hi := imm[nat.RegProtoMin], imm[nat.RegProtoMax]
			if got := fmt.Sprintf("%d-%d", int(lo[0])<<8|int(lo[1]), int(hi[0])<<8|int(hi[1])); got != block.String() {
				t.Errorf("rule %d: port range %s, want %s", i, got, block)
			}
		}
	}
	// No block: address-only SNAT for every protocol.
	for i, r := range testRules.natRules(job, jobEgress{addr: testRules.egress[0]}) {
		if nat, _ := natOf(t, r); nat.RegProtoMin != 0 {
			t.Errorf("no block, rule %d: has a port range", i)
		}
	}
}

func TestFilterRules(t *testing.T) {
	// Every floor prefix is dropped, and the chain ends with accept.
	fj := testRules.fromJobsRules()
	if got, want := len(fj), 2+len(testRules.floorV4())+3+1+1+1; got != want {
		t.Errorf("from_jobs rules: got %d, want %d", got, want)
	}
	if v, ok := fj[len(fj)-1][0].(*expr.Verdict); !ok || v.Kind != expr.VerdictAccept {
		t.Errorf("from_jobs ends with %v, want accept", fj[len(fj)-1])
	}
	if v, ok := fj[len(fj)-2][0].(*expr.Verdict); !ok || v.Kind != expr.VerdictJump || v.Chain != chainLimits {
		t.Errorf("from_jobs rule before accept is %v, want jump %s", fj[len(fj)-2], chainLimits)
	}
	if r := fj[len(fj)-3]; len(r) == 0 {
		t.Error("empty from_jobs rule")
	} else if v, ok := r[len(r)-1].(*expr.Verdict); !ok || v.Kind != expr.VerdictJump || v.Chain != chainPolicy {
		t.Errorf("from_jobs rule before the limits is %v, want jump %s", fj[len(fj)-3], chainPolicy)
	}
	for _, r := range fj[:len(fj)-3] {
		if v, ok := r[len(r)-1].(*expr.Verdict); !ok || !(v.Kind == expr.VerdictDrop || v.Kind == expr.VerdictGoto && (v.Chain == chainRefuse || v.Chain == chainFloor)) {
			t.Errorf("from_jobs rule %v neither drops nor refuses", r)
		}
	}
	// to_host ends with drop; it accepts only the gateway address.
	th := testRules.toHostRules()
	if v, ok := th[len(th)-1][0].(*expr.Verdict); !ok || v.Kind != expr.VerdictGoto || v.Chain != chainFloor {
		t.Errorf("to_host ends with %v, want goto floor", th[len(th)-1])
	}
	gw := testRules.v4().Addr().As4()
	if v, ok := th[len(th)-2][0].(*expr.Verdict); !ok || v.Kind != expr.VerdictJump || v.Chain != chainPolicyHost {
		t.Errorf("to_host rule before the last is %v, want jump %s", th[len(th)-2], chainPolicyHost)
	}
	for _, r := range th[1 : len(th)-2-len(testRules.floorRules())] {
		found := false
		for _, e := range r {
			if c, ok := e.(*expr.Cmp); ok && string(c.Data) == string(gw[:]) {
				found = true
			}
		}
		if !found {
			t.Errorf("to_host rule %v does not match the gateway address", r)
		}
	}
	// The first two forward rules clamp the MSS to the route MTU.
	for _, r := range testRules.forwardRules()[:2] {
		var rt, hton, ex bool
		for _, e := range r {
			switch e := e.(type) {
			case *expr.Rt:
				rt = e.Key == expr.RtTCPMSS
			case *expr.Byteorder:
				// rt mtu is host order; the option is network order.
				hton = rt && e.Op == expr.ByteorderHton && e.Size == 2 && e.SourceRegister == 1 && e.DestRegister == 1
			case *expr.Exthdr:
				ex = hton && e.Op == expr.ExthdrOpTcpopt && e.Type == 2 && e.SourceRegister == 1
			}
		}
		if !rt || !hton || !ex {
			t.Errorf("forward rule %v: want rt mtu, in network byte order, into tcp option maxseg", r)
		}
	}
}

func TestStateTag(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string
		ok   bool
	}{{"airlock ip_forward=0", "0", true}, {"airlock ip_forward=1", "1", true}, {"airlock ip_forward=", "", false}, {"other", "", false}} {
		got, ok := parseStateTag([]byte(tt.in), v4Family.stateTag)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseStateTag(%q): got %q, %v, want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
	if got, _ := parseStateTag(stateTag(v4Family.stateTag, "0"), v4Family.stateTag); got != "0" {
		t.Errorf("round trip: got %q", got)
	}
	if got, ok := parseStateTag(stateTag(v6Family.stateTag, "0"), v4Family.stateTag); ok {
		t.Errorf("the IPv6 tag parsed as ip_forward: %q", got)
	}
	if got, _ := parseStateTag(stateTag(v6Family.stateTag, "1"), v6Family.stateTag); got != "1" {
		t.Errorf("IPv6 round trip: got %q", got)
	}
}

func TestPrivError(t *testing.T) {
	err := privError("create tun", &os.PathError{Op: "open", Path: "/dev/net/tun", Err: unix.EPERM})
	if !errors.Is(err, ErrNotPrivileged) || !strings.HasPrefix(err.Error(), "kernel egress needs root or CAP_NET_ADMIN: ") {
		t.Errorf("EPERM: got %v, want ErrNotPrivileged with the fix", err)
	}
	if err := privError("x", unix.EBUSY); errors.Is(err, ErrNotPrivileged) {
		t.Errorf("EBUSY reported as a privilege error: %v", err)
	}
}
