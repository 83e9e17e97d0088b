// SPDX-License-Identifier: MIT

package portblock

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseAddrs(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    string // space-separated
		wantErr string
	}{
		{in: "203.0.113.1", want: "203.0.113.1"},
		{in: "203.0.113.1, 203.0.113.9", want: "203.0.113.1 203.0.113.9"},
		{in: "203.0.113.0/29", want: "203.0.113.1 203.0.113.2 203.0.113.3 203.0.113.4 203.0.113.5 203.0.113.6"},
		{in: "203.0.113.4/31", want: "203.0.113.4 203.0.113.5"},
		{in: "203.0.113.7/32", want: "203.0.113.7"},
		{in: "203.0.113.1,203.0.113.0/30", wantErr: "twice"},
		{in: "10.0.0.0/8", wantErr: "more than"},
		{in: "gw.example.org", wantErr: "IP address"},
		{in: "", wantErr: "no address"},
	} {
		got, err := ParseAddrs(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseAddrs(%q): got %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		var s []string
		for _, a := range got {
			s = append(s, a.String())
		}
		if err != nil || strings.Join(s, " ") != tt.want {
			t.Errorf("ParseAddrs(%q) = %v, %v; want %s", tt.in, s, err, tt.want)
		}
	}
}

// TestPool: every (address, block) pair is one block, consecutive blocks
// alternate addresses, and BlockOf inverts Block.
func TestPool(t *testing.T) {
	plan, err := NewPlan(Range{Lo: 40000, Hi: 40099}, 25)
	if err != nil {
		t.Fatal(err)
	}
	a, b := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2")
	p := Pool{Addrs: []netip.Addr{a, b}, Plan: plan}
	if p.Blocks() != 8 {
		t.Fatalf("Blocks() = %d, want 8", p.Blocks())
	}
	seen := map[string]bool{}
	for i := 0; i < p.Blocks(); i++ {
		addr, r := p.Block(i)
		if want := []netip.Addr{a, b}[i%2]; addr != want {
			t.Errorf("Block(%d) address %v, want %v", i, addr, want)
		}
		key := addr.String() + " " + r.String()
		if seen[key] {
			t.Errorf("Block(%d) = %s twice", i, key)
		}
		seen[key] = true
		for _, port := range []uint16{r.Lo, r.Hi} {
			if got := p.BlockOf(addr, port); got != i {
				t.Errorf("BlockOf(%v, %d) = %d, want %d", addr, port, got, i)
			}
		}
	}
	if got := p.BlockOf(netip.MustParseAddr("203.0.113.3"), 40000); got != -1 {
		t.Errorf("BlockOf(foreign address) = %d, want -1", got)
	}
	if got := p.BlockOf(a, 39999); got != -1 {
		t.Errorf("BlockOf(port outside) = %d, want -1", got)
	}
	if (Pool{}).Blocks() != 0 {
		t.Error("zero Pool has blocks")
	}
}

// TestPoolRun: a run of n blocks from pool block i is n consecutive port
// blocks of i's address, and every port of it maps back (BlockOf) to one
// of the run's blocks.
func TestPoolRun(t *testing.T) {
	a1, a2 := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.2")
	plan, err := NewPlan(Range{20000, 21023}, 256)
	if err != nil {
		t.Fatal(err)
	}
	p := Pool{Addrs: []netip.Addr{a1, a2}, Plan: plan}
	for _, tt := range []struct {
		i, n     int
		addr     netip.Addr
		lo, hi   uint16
		wantRuns []int
	}{
		{i: 0, n: 1, addr: a1, lo: 20000, hi: 20255, wantRuns: []int{0}},
		{i: 1, n: 4, addr: a2, lo: 20000, hi: 21023, wantRuns: []int{1, 3, 5, 7}},
		{i: 2, n: 2, addr: a1, lo: 20256, hi: 20767, wantRuns: []int{2, 4}},
	} {
		addr, r := p.Run(tt.i, tt.n)
		if addr != tt.addr || r != (Range{tt.lo, tt.hi}) {
			t.Errorf("Run(%d, %d) = %v %v, want %v %d-%d", tt.i, tt.n, addr, r, tt.addr, tt.lo, tt.hi)
		}
		for port := int(r.Lo); port <= int(r.Hi); port++ {
			if b := p.BlockOf(addr, uint16(port)); b != tt.wantRuns[(port-int(r.Lo))/256] {
				t.Fatalf("BlockOf(%v, %d) = %d, want %d", addr, port, b, tt.wantRuns[(port-int(r.Lo))/256])
			}
		}
	}
	for ports, want := range map[int]int{0: 1, 64: 1, 256: 1, 257: 2, 1024: 4, 1025: 5} {
		if got := p.BlocksFor(ports); got != want {
			t.Errorf("BlocksFor(%d) = %d, want %d", ports, got, want)
		}
	}
}
