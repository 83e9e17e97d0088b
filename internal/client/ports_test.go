// SPDX-License-Identifier: MIT

package client

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
)

func TestPortsEnv(t *testing.T) {
	pub := netip.MustParseAddr("203.0.113.1")
	env := []string{"PATH=/bin", EgressPortsEnv + "=1-2", EgressAddrEnv + "=192.0.2.9"}
	for _, tc := range []struct {
		name    string
		asked   int
		ls      control.Lease
		want    []string
		wantErr string
	}{
		{"block", 0, control.Lease{PublicAddrs: []netip.Addr{pub}, Ports: [2]uint16{20000, 20255}},
			[]string{"PATH=/bin", EgressAddrEnv + "=203.0.113.1", EgressPortsEnv + "=20000-20255"}, ""},
		{"asked and granted", 1024, control.Lease{PublicAddrs: []netip.Addr{pub}, Ports: [2]uint16{20000, 21023}},
			[]string{"PATH=/bin", EgressAddrEnv + "=203.0.113.1", EgressPortsEnv + "=20000-21023"}, ""},
		{"granted more", 100, control.Lease{PublicAddrs: []netip.Addr{pub}, Ports: [2]uint16{20000, 20255}},
			[]string{"PATH=/bin", EgressAddrEnv + "=203.0.113.1", EgressPortsEnv + "=20000-20255"}, ""},
		{"no block", 0, control.Lease{}, []string{"PATH=/bin"}, ""},
		{"granted fewer", 1024, control.Lease{PublicAddrs: []netip.Addr{pub}, Ports: [2]uint16{20000, 20255}}, nil, "granted 256 egress ports, asked for 1024"},
		{"asked, no block", 64, control.Lease{}, nil, "granted 0 egress ports"},
	} {
		got, err := portsEnv(env, tc.asked, tc.ls)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: got %v, %v; want an error containing %q", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	for n, ok := range map[int]bool{0: true, 64: true, 65535: true, -1: false, 65536: false} {
		if err := checkPorts(n); (err == nil) != ok {
			t.Errorf("checkPorts(%d) = %v, want ok %v", n, err, ok)
		}
	}
}
