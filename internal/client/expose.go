// SPDX-License-Identifier: MIT

package client

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// ExposedEnvPrefix starts the names of the variables that tell a job where
// its exposed ports are reachable: AIRLOCK_EXPOSED_<PORT>=IP:PUBPORT for
// TCP, AIRLOCK_EXPOSED_<PORT>_UDP=IP:PUBPORT for UDP; ExposedEnvPrefix6
// those of the same ports over IPv6 (AIRLOCK_EXPOSED6_<PORT>=[IP6]:PUBPORT).
const (
	ExposedEnvPrefix  = "AIRLOCK_EXPOSED_"
	ExposedEnvPrefix6 = "AIRLOCK_EXPOSED6_"
)

// exposedEnvPrefixes are the variable prefixes by address family.
var exposedEnvPrefixes = [ipfamily.N]string{ExposedEnvPrefix, ExposedEnvPrefix6}

// ExposedEnvName returns the variable name for an exposed port over IPv4.
func ExposedEnvName(p control.Port) string { return exposedEnvName(ipfamily.V4, p) }

// exposedEnvName returns the variable name for an exposed port over
// family f.
func exposedEnvName(f *ipfamily.Family, p control.Port) string {
	n := exposedEnvPrefixes[f.Index] + strconv.Itoa(int(p.Port))
	if p.Proto == control.ProtoUDP {
		n += "_UDP"
	}
	return n
}

// checkExpose validates the --expose list before joining.
func checkExpose(ports []control.Port) error {
	seen := map[control.Port]bool{}
	for _, p := range ports {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("bad --expose: %w", err)
		}
		if seen[p] {
			return fmt.Errorf("bad --expose: %s given twice", p)
		}
		seen[p] = true
	}
	return nil
}

// exposedEnv returns env without inherited AIRLOCK_EXPOSED_ and
// AIRLOCK_EXPOSED6_ variables, plus one for every mapping the gateway
// granted (got: those of both families, control.Lease.AllExposed). It
// fails unless the gateway granted exactly the ports asked for over IPv4
// (over IPv6, a gateway without IPv6 egress grants none), or if it sent a
// mapping not asked for.
func exposedEnv(env []string, asked []control.Port, got []control.Exposed) ([]string, error) {
	var want [ipfamily.N]map[control.Port]bool
	var n [ipfamily.N]int
	for i := range want {
		want[i] = map[control.Port]bool{}
		for _, p := range asked {
			want[i][p] = true
		}
	}
	out := make([]string, 0, len(env)+len(got))
	for _, kv := range env {
		if !strings.HasPrefix(kv, ExposedEnvPrefix) && !strings.HasPrefix(kv, ExposedEnvPrefix6) {
			out = append(out, kv)
		}
	}
	for _, x := range got {
		f := ipfamily.Of(x.PublicAddr)
		if f == nil || !want[f.Index][x.Port] || x.PublicPort == 0 {
			return nil, fmt.Errorf("gateway sent an exposure that was not asked for: %s at %v:%d", x.Port, x.PublicAddr, x.PublicPort)
		}
		delete(want[f.Index], x.Port)
		n[f.Index]++
		out = append(out, exposedEnvName(f, x.Port)+"="+netip.AddrPortFrom(x.PublicAddr, x.PublicPort).String())
	}
	if n[ipfamily.V4.Index] != len(asked) {
		return nil, fmt.Errorf("gateway exposed %d ports, asked for %d (is it older than this client?)", n[ipfamily.V4.Index], len(asked))
	}
	return out, nil
}
