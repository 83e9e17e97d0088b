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
	// Both families: one variable per port lists its mappings, IPv4
	// first, and the deprecated AIRLOCK_EXPOSED6_ alias names the IPv6
	// one; inherited ones of both are dropped, and a gateway without IPv6
	// egress may send none.
	a6 := netip.MustParseAddr("2001:db8::1")
	both := append(append([]control.Exposed(nil), got...),
		control.Exposed{Port: tcp, PublicAddr: a6, PublicPort: 33023}, control.Exposed{Port: udp, PublicAddr: a6, PublicPort: 33022})
	env, err = exposedEnv([]string{"A=1", "AIRLOCK_EXPOSED6_9=[::1]:1"}, asked, both)
	want = []string{"A=1", "AIRLOCK_EXPOSED_8080=203.0.113.1:33023,[2001:db8::1]:33023", "AIRLOCK_EXPOSED_8080_UDP=203.0.113.1:33022,[2001:db8::1]:33022",
		"AIRLOCK_EXPOSED6_8080=[2001:db8::1]:33023", "AIRLOCK_EXPOSED6_8080_UDP=[2001:db8::1]:33022"}
	if err != nil || !reflect.DeepEqual(env, want) {
		t.Errorf("both families: got %q, %v; want %q", env, err, want)
	}
	if _, err := exposedEnv(nil, asked[:1], append(got[:1:1], control.Exposed{Port: udp, PublicAddr: a6, PublicPort: 1})); err == nil {
		t.Error("an IPv6 exposure not asked for: no error")
	}
	if _, err := exposedEnv(nil, asked, both[2:]); err == nil {
		t.Error("IPv6 exposures without the IPv4 ones: no error")
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
