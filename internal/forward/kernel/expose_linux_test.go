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
	r := ruleset{tun: DefaultName, addr: tunnelAddr, egress: egressAddr}
	job := netip.MustParseAddr("100.64.0.2")
	for _, tc := range []struct {
		ex []forward.Exposure
		n  int
		ok bool
	}{
		{nil, 0, true},
		{[]forward.Exposure{{Proto: ipproto.TCP, JobPort: 8080, PublicPort: 20255}, {Proto: ipproto.UDP, JobPort: 53, PublicPort: 20254}}, 2, true},
		{[]forward.Exposure{{Proto: ipproto.Proto(132), JobPort: 8080, PublicPort: 20255}}, 0, false},
		{[]forward.Exposure{{Proto: ipproto.TCP, JobPort: 0, PublicPort: 20255}}, 0, false},
		{[]forward.Exposure{{Proto: ipproto.TCP, JobPort: 80, PublicPort: 0}}, 0, false},
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
	job := netip.MustParseAddr("100.64.0.2")
	if err := f.AddJob(forward.Job{Addr: job, Block: portblock.Range{Lo: 20000, Hi: 20255}}); err != nil {
		t.Fatal(err)
	}
	ex := []forward.Exposure{{Proto: ipproto.TCP, JobPort: 8080, PublicPort: 20255}, {Proto: ipproto.UDP, JobPort: 53, PublicPort: 20254}}
	if err := f.expose(job, ex); err != nil {
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
	if err := f.expose(job, ex[:1]); err != nil {
		t.Fatalf("Expose again: %v", err)
	}
	if out := nftList(t); out != "" && (strings.Contains(out, "dport 20254") || !strings.Contains(out, "dport 20255")) {
		t.Errorf("second Expose did not replace the rules:\n%s", out)
	}
	if err := f.expose(netip.MustParseAddr("10.0.0.1"), ex); err == nil {
		t.Error("Expose accepted an address outside the tunnel subnet")
	}
	f.unexpose(job)
	if out := nftList(t); out != "" && strings.Contains(out, "dnat ip to") {
		t.Errorf("dnat rules after Unexpose:\n%s", out)
	}
	f.unexpose(job) // twice is harmless
	if got := jobRuleCount(t, job); got != 3 {
		t.Errorf("snat rules after Unexpose: got %d, want 3 (untouched)", got)
	}
}
