// SPDX-License-Identifier: MIT

package portblock

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestPlan(t *testing.T) {
	p, err := NewPlan(Range{20000, 20999}, 256)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Blocks(), 3; got != want {
		t.Errorf("blocks: got %d, want %d", got, want)
	}
	if got, want := p.Block(1), (Range{20256, 20511}); got != want {
		t.Errorf("block 1: got %v, want %v", got, want)
	}
	for _, tt := range []struct {
		port uint16
		want int
	}{{20000, 0}, {20255, 0}, {20256, 1}, {20767, 2}, {20768, -1}, {19999, -1}} {
		if got := p.BlockOf(tt.port); got != tt.want {
			t.Errorf("BlockOf(%d): got %d, want %d", tt.port, got, tt.want)
		}
	}
	if _, err := NewPlan(Range{1, 10}, 11); err == nil {
		t.Error("block larger than range accepted")
	}
	for _, s := range []string{"", "5", "10-5", "0-10", "1-70000", "a-b"} {
		if _, err := ParseRange(s); err == nil {
			t.Errorf("ParseRange(%q) accepted", s)
		}
	}
	if r, err := ParseRange(" 20000 - 59999 "); err != nil || r != (Range{20000, 59999}) {
		t.Errorf("ParseRange: got %v, %v", r, err)
	}
}

func TestDialUDPInBlock(t *testing.T) {
	host, err := HostEphemeralRange()
	if err != nil {
		t.Fatal(err)
	}
	block := Range{host.Lo + 2000, host.Lo + 2007}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	d := &Dialer{Block: block, Base: net.Dialer{Timeout: time.Second}}
	c, err := d.DialContext(context.Background(), "udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := netip.MustParseAddrPort(c.LocalAddr().String()).Port(); !block.Contains(p) {
		t.Errorf("udp source port %d outside block %v", p, block)
	}
}
