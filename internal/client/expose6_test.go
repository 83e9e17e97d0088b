// SPDX-License-Identifier: MIT

package client

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
)

func TestExposedEnv6(t *testing.T) {
	asked := []control.Port{{Proto: control.ProtoTCP, Port: 8080}, {Proto: control.ProtoUDP, Port: 8080}}
	a6 := netip.MustParseAddr("2001:db8::1")
	got, err := exposedEnv6([]string{"A=1", "AIRLOCK_EXPOSED6_9=[::1]:1"}, asked, []control.Exposed{
		{Port: asked[0], PublicAddr: a6, PublicPort: 33023},
		{Port: asked[1], PublicAddr: a6, PublicPort: 33022},
	})
	want := []string{"A=1", "AIRLOCK_EXPOSED6_8080=[2001:db8::1]:33023", "AIRLOCK_EXPOSED6_8080_UDP=[2001:db8::1]:33022"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	if _, err := exposedEnv6(nil, asked[:1], []control.Exposed{{Port: asked[1], PublicAddr: a6, PublicPort: 1}}); err == nil {
		t.Error("an IPv6 exposure not asked for: no error")
	}
	if got, err := exposedEnv6([]string{"A=1"}, asked, nil); err != nil || !slices.Equal(got, []string{"A=1"}) {
		t.Errorf("no IPv6 exposures: %q, %v", got, err)
	}
}
