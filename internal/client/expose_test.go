// SPDX-License-Identifier: MIT

package client

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
)

func TestExposedEnv(t *testing.T) {
	pub := netip.MustParseAddr("203.0.113.1")
	tcp := control.Port{Proto: control.ProtoTCP, Port: 8080}
	udp := control.Port{Proto: control.ProtoUDP, Port: 8080}
	asked := []control.Port{tcp, udp}
	got := []control.Exposed{{Port: tcp, PublicAddr: pub, PublicPort: 33023}, {Port: udp, PublicAddr: pub, PublicPort: 33022}}
	env, err := exposedEnv([]string{"A=1", "AIRLOCK_EXPOSED_9=stale"}, asked, got)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"A=1", "AIRLOCK_EXPOSED_8080=203.0.113.1:33023", "AIRLOCK_EXPOSED_8080_UDP=203.0.113.1:33022"}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("got %q, want %q", env, want)
	}
	if _, err := exposedEnv(nil, asked, got[:1]); err == nil {
		t.Error("fewer exposures than asked: got no error")
	}
	if _, err := exposedEnv(nil, []control.Port{tcp, {Proto: control.ProtoTCP, Port: 1}}, got); err == nil {
		t.Error("exposure not asked for: got no error")
	}
}

func TestCheckExpose(t *testing.T) {
	tcp := control.Port{Proto: control.ProtoTCP, Port: 8080}
	for _, tc := range []struct {
		in []control.Port
		ok bool
	}{
		{nil, true},
		{[]control.Port{tcp, {Proto: control.ProtoUDP, Port: 8080}}, true},
		{[]control.Port{tcp, tcp}, false},
		{[]control.Port{{Proto: control.ProtoTCP}}, false},
	} {
		if err := checkExpose(tc.in); (err == nil) != tc.ok {
			t.Errorf("checkExpose(%v) = %v, want ok %v", tc.in, err, tc.ok)
		}
	}
}
