// SPDX-License-Identifier: MIT

package kernel

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func TestExposeRulesValidate(t *testing.T) {
	r := ruleset{tun: DefaultName, tunnels: [2]netip.Prefix{tunnelAddr}, egress: [2]netip.Addr{egressAddr}}
	job := forward.Job{ID: "L", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}}
	for _, tc := range []struct {
		ex []forward.Exposure
		n  int
		ok bool
	}{
		{nil, 0, true},
		{[]forward.Exposure{{Proto: ipproto.TCP, JobPort: 8080, PublicPort: 20255, PublicAddr: egressAddr}, {Proto: ipproto.UDP, JobPort: 53, PublicPort: 20254, PublicAddr: egressAddr}}, 2, true},
		{[]forward.Exposure{{Proto: ipproto.Proto(132), JobPort: 8080, PublicPort: 20255, PublicAddr: egressAddr}}, 0, false},
		{[]forward.Exposure{{Proto: ipproto.TCP, JobPort: 0, PublicPort: 20255, PublicAddr: egressAddr}}, 0, false},
		{[]forward.Exposure{{Proto: ipproto.TCP, JobPort: 80, PublicPort: 0, PublicAddr: egressAddr}}, 0, false},
		{[]forward.Exposure{{Proto: ipproto.TCP, JobPort: 80, PublicPort: 80, PublicAddr: netip.MustParseAddr("2001:db8::1")}}, 0, false}, // no IPv6 address
	} {
		rules, err := r.exposeRules(job, tc.ex)
		if (err == nil) != tc.ok || len(rules) != tc.n {
			t.Errorf("exposeRules(%v): got %d rules, %v; want %d, ok %v", tc.ex, len(rules), err, tc.n, tc.ok)
		}
	}
}

func TestExpose(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	f := newTestForwarder(t)
	defer f.Close()
	job := forward.Job{ID: "L", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")},
		Egress: []forward.Egress{{Addr: egressAddr, Block: portblock.Range{Lo: 20000, Hi: 20255}}}}
	if err := f.AddJob(job); err != nil {
		t.Fatal(err)
	}
	ex := []forward.Exposure{{Proto: ipproto.TCP, JobPort: 8080, PublicPort: 20255, PublicAddr: egressAddr}, {Proto: ipproto.UDP, JobPort: 53, PublicPort: 20254, PublicAddr: egressAddr}}
	job.Exposures = ex
	if err := f.expose(job); err != nil {
		t.Fatalf("Expose: %v", err)
	}
	out := nftList(t)
	for _, want := range []string{
		`iifname != "airlock0" ip daddr 203.0.113.1 tcp dport 20255 dnat ip to 100.64.0.2:8080`,
		`iifname != "airlock0" ip daddr 203.0.113.1 udp dport 20254 dnat ip to 100.64.0.2:53`,
		`oifname "airlock0" ct status dnat accept`,
	} {
		if out != "" && !strings.Contains(out, want) {
			t.Errorf("nft list table lacks %q:\n%s", want, out)
		}
	}
	// Exposing again replaces.
	job.Exposures = ex[:1]
	if err := f.expose(job); err != nil {
		t.Fatalf("Expose again: %v", err)
	}
	if out := nftList(t); out != "" && (strings.Contains(out, "dport 20254") || !strings.Contains(out, "dport 20255")) {
		t.Errorf("second Expose did not replace the rules:\n%s", out)
	}
	if err := f.expose(forward.Job{ID: "M", Addrs: job.Addrs, Exposures: ex}); err == nil {
		t.Error("Expose accepted a job not added")
	}
	f.unexpose("L")
	if out := nftList(t); out != "" && strings.Contains(out, "dnat ip to") {
		t.Errorf("dnat rules after Unexpose:\n%s", out)
	}
	f.unexpose("L") // twice is harmless
	if got := jobRuleCount(t, "L"); got != 3 {
		t.Errorf("snat rules after Unexpose: got %d, want 3 (untouched)", got)
	}
}
