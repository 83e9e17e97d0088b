// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"reflect"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

func TestAllocExposures(t *testing.T) {
	block := portblock.Range{Lo: 33000, Hi: 33015} // 16 ports: at most 4
	ex := func(proto ipproto.Proto, job, pub uint16) forward.Exposure {
		return forward.Exposure{Proto: proto, JobPort: job, PublicPort: pub}
	}
	tcp := func(p uint16) control.Port { return control.Port{Proto: control.ProtoTCP, Port: p} }
	udp := func(p uint16) control.Port { return control.Port{Proto: control.ProtoUDP, Port: p} }
	for _, tc := range []struct {
		name  string
		block portblock.Range
		reqs  []control.Port
		want  []forward.Exposure
		ok    bool
	}{
		{"none", block, nil, nil, true},
		{"none without block", portblock.Range{}, nil, nil, true},
		{"one", block, []control.Port{tcp(8080)}, []forward.Exposure{ex(ipproto.TCP, 8080, 33015)}, true},
		{"top down", block, []control.Port{tcp(8080), udp(8080), tcp(22), udp(53)},
			[]forward.Exposure{ex(ipproto.TCP, 8080, 33015), ex(ipproto.UDP, 8080, 33014), ex(ipproto.TCP, 22, 33013), ex(ipproto.UDP, 53, 33012)}, true},
		{"over a quarter", block, []control.Port{tcp(1), tcp(2), tcp(3), tcp(4), tcp(5)}, nil, false},
		{"duplicate", block, []control.Port{tcp(8080), tcp(8080)}, nil, false},
		{"no block", portblock.Range{}, []control.Port{tcp(8080)}, nil, false},
		{"tiny block", portblock.Range{Lo: 100, Hi: 102}, []control.Port{tcp(8080)}, nil, false},
		{"port 0", block, []control.Port{tcp(0)}, nil, false},
		{"bad proto", block, []control.Port{{Proto: ipproto.Proto(132), Port: 9}}, nil, false},
		{"block at 65535", portblock.Range{Lo: 65528, Hi: 65535}, []control.Port{udp(9), tcp(9)},
			[]forward.Exposure{ex(ipproto.UDP, 9, 65535), ex(ipproto.TCP, 9, 65534)}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := allocExposures(tc.block, tc.reqs)
			if (err == nil) != tc.ok {
				t.Fatalf("got err %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, errNoExposure) {
				t.Errorf("got %v, want an error wrapping errNoExposure", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			for _, x := range got {
				if !tc.block.Contains(x.PublicPort) {
					t.Errorf("public port %d outside block %v", x.PublicPort, tc.block)
				}
			}
		})
	}
}
