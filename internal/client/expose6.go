// SPDX-License-Identifier: MIT

package client

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
)

// ExposedEnvPrefix6 starts the names of the variables that tell a
// dual-stack job where its exposed ports are reachable over IPv6:
// AIRLOCK_EXPOSED6_<PORT>=[IP6]:PUBPORT, AIRLOCK_EXPOSED6_<PORT>_UDP for UDP.
const ExposedEnvPrefix6 = "AIRLOCK_EXPOSED6_"

// exposedEnv6 returns env without inherited AIRLOCK_EXPOSED6_ variables,
// plus one for every IPv6 mapping the gateway granted (none from a gateway
// without IPv6 egress). A mapping of a port not asked for is an error.
func exposedEnv6(env []string, asked []control.Port, got []control.Exposed) ([]string, error) {
	want := map[control.Port]bool{}
	for _, p := range asked {
		want[p] = true
	}
	out := make([]string, 0, len(env)+len(got))
	for _, kv := range env {
		if !strings.HasPrefix(kv, ExposedEnvPrefix6) {
			out = append(out, kv)
		}
	}
	for _, x := range got {
		if !want[x.Port] || !x.PublicAddr.Is6() || x.PublicPort == 0 {
			return nil, fmt.Errorf("gateway sent an IPv6 exposure that was not asked for: %s at %v:%d", x.Port, x.PublicAddr, x.PublicPort)
		}
		delete(want, x.Port)
		name := ExposedEnvPrefix6 + strings.TrimPrefix(ExposedEnvName(x.Port), ExposedEnvPrefix)
		out = append(out, name+"="+netip.AddrPortFrom(x.PublicAddr, x.PublicPort).String())
	}
	return out, nil
}
