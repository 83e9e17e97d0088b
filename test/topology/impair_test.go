// SPDX-License-Identifier: MIT

package topology_test

import (
	"encoding/json"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/impair"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestImpairment checks the relay on a real topology: ping sees the
// configured round-trip time, a transfer through a lossy, reordering path
// arrives intact, and the namespaces still isolate cn from inet.
func TestImpairment(t *testing.T) {
	t.Parallel()
	c := impair.Symmetric(40*time.Millisecond, 0.01)
	c.Up.Reorder = 0.05
	tp := topology.New(t, topology.WithNativeRouting(), topology.WithImpairment(c))
	if tp.WAN == "" || tp.Impairment == nil || tp.Impairment.Seed == 0 {
		t.Fatalf("WAN %q, impairment %v: want a wan namespace and a seeded config", tp.WAN, tp.Impairment)
	}
	u := topology.EnsureUser(t)

	// The path's neighbours first: the relay drops 1 % of all frames,
	// ARP too, and a lost first ARP request holds every packet queued
	// behind it for the kernel's 1-s retry (seen: the first 12 pings at
	// 1076 down to 452 ms).
	for i := 0; i < 5; i++ {
		if code, _, _ := tp.Run(t, 10*time.Second, tp.CN, nil, "ping", "-n", "-c", "1", "-W", "3", tp.INETAddr.String()); code == 0 {
			break
		}
	}
	// 20 pings at 40 ms RTT. A request the up direction reorders skips
	// its 20 ms, so a reply may come after 20 ms; most take 40 ms; 1 %
	// loss may take one or two.
	code, out, stderr := tp.Run(t, 30*time.Second, tp.CN, nil, "ping", "-n", "-c", "20", "-i", "0.05", "-W", "2", tp.INETAddr.String())
	var at40, early int
	for _, m := range regexp.MustCompile(`time=([\d.]+) ms`).FindAllStringSubmatch(out, -1) {
		rtt, _ := strconv.ParseFloat(m[1], 64)
		switch {
		case rtt < 19.5:
			early++
		case rtt >= 39.5 && rtt <= 45:
			at40++
		}
	}
	if early > 0 || at40 < 12 {
		t.Errorf("ping through a 40 ms relay: %d replies at 39.5–45 ms (want ≥ 12), %d under 19.5 ms (want 0); exit %d\n%s%s", at40, early, code, out, stderr)
	}

	port, sha := tp.StartHTTP(t, map[string]int64{"blob": 4 << 20})
	web := netip.AddrPortFrom(tp.INETAddr, uint16(port))
	code, out, stderr = tp.Run(t, 90*time.Second, tp.CN, u, "sh", "-c", "curl -sS --max-time 80 http://"+web.String()+"/blob | sha256sum")
	if code != 0 || !strings.HasPrefix(out, sha["blob"]) {
		t.Fatalf("curl | sha256sum through loss and reordering: exit %d, %q, want %s; stderr %s", code, out, sha["blob"], stderr)
	}
	if !strings.Contains(strings.Join(tp.Namespaces(), " "), tp.WAN) {
		t.Errorf("Namespaces() = %v, want %s in it", tp.Namespaces(), tp.WAN)
	}
	var back impair.Config
	b, _ := json.Marshal(tp.Impairment)
	if err := json.Unmarshal(b, &back); err != nil || back.Up.Reorder != 0.05 {
		t.Errorf("Impairment round trip: %v %+v", err, back)
	}
}

// TestImpairmentIsolation checks that the relay's topology is still
// isolated without native routing.
func TestImpairmentIsolation(t *testing.T) {
	t.Parallel()
	tp := topology.New(t, topology.WithImpairment(impair.Config{}))
	port, _ := tp.StartHTTP(t, map[string]int64{"f": 1024})
	if tp.TCPCheck(t, tp.CN, nil, netip.AddrPortFrom(tp.INETAddr, uint16(port))) {
		t.Fatal("cn reached inet through the relay without routing")
	}
	lst := netip.AddrPortFrom(tp.CNAddr, uint16(tp.Port()))
	tp.StartTCPListener(t, tp.CN, lst)
	if !tp.TCPCheck(t, tp.DMZ, nil, lst) {
		t.Errorf("dmz cannot reach cn %v through the relay", lst)
	}
}
