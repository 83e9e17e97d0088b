// SPDX-License-Identifier: MIT

package bench

import (
	"runtime"
	"testing"
	"time"
)

// The helpers of TestBench that need no root: they run in `make test`.

func TestBusyCores(t *testing.T) {
	n := float64(runtime.NumCPU())
	for _, tc := range []struct {
		before, after cpuTimes
		want          float64
	}{
		{cpuTimes{busy: 100, total: 1000}, cpuTimes{busy: 150, total: 1100}, 0.5 * n},
		{cpuTimes{busy: 100, total: 1000}, cpuTimes{busy: 100, total: 1100}, 0},
		{cpuTimes{busy: 100, total: 1000}, cpuTimes{busy: 100, total: 1000}, 0}, // no time passed
	} {
		if got := tc.after.busyCores(tc.before); got != tc.want {
			t.Errorf("busyCores(%+v → %+v): got %v, want %v", tc.before, tc.after, got, tc.want)
		}
	}
	if got := busyCores(50 * time.Millisecond); got < 0 || got > n+0.01 {
		t.Errorf("busyCores of this machine: got %v, want 0..%v", got, n)
	}
	if got := loadAvg1(); got < 0 {
		t.Errorf("loadAvg1: got %v, want ≥ 0", got)
	}
}

func TestParsePing(t *testing.T) {
	out := `PING 203.0.113.2 (203.0.113.2) 56(84) bytes of data.
64 bytes from 203.0.113.2: icmp_seq=1 ttl=63 time=0.412 ms
64 bytes from 203.0.113.2: icmp_seq=2 ttl=63 time=12.5 ms
From 198.51.100.1 icmp_seq=3 Destination Host Unreachable

--- 203.0.113.2 ping statistics ---
3 packets transmitted, 2 received, 33% packet loss, time 2003ms
rtt min/avg/max/mdev = 0.412/6.456/12.500/6.044 ms
`
	got := parsePing(out)
	if len(got) != 2 || got[0] != 0.412 || got[1] != 12.5 {
		t.Errorf("got %v, want [0.412 12.5]", got)
	}
}

func TestParseLists(t *testing.T) {
	if got, err := parseInts("1, 10,,20"); err != nil || len(got) != 3 || got[2] != 20 {
		t.Errorf("parseInts: got %v, %v", got, err)
	}
	for _, bad := range []string{"0", "x", "-1"} {
		if _, err := parseInts(bad); err == nil {
			t.Errorf("parseInts(%q): got no error", bad)
		}
	}
	if w, err := parseWAN("40-0.1"); err != nil || w.suffix() != "+rtt40ms-loss0.1%" {
		t.Errorf("parseWAN: got %v %q, %v", w, w.suffix(), err)
	}
	if got := sanitize("1gbit+rtt40ms-loss0.1%"); got != "1gbit_rtt40ms-loss0.1_" {
		t.Errorf("sanitize: got %q", got)
	}
}
