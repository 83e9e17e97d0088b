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
// its exposed ports are reachable, one per port of every family:
// AIRLOCK_EXPOSED_<PORT>=IP:PUBPORT[,[IP6]:PUBPORT] for TCP,
// AIRLOCK_EXPOSED_<PORT>_UDP=… for UDP, the list IPv4 first.
// ExposedEnvPrefix6 names the deprecated per-family alias of the IPv6
// entry (AIRLOCK_EXPOSED6_<PORT>=[IP6]:PUBPORT), still set for a release.
const (
	ExposedEnvPrefix  = "AIRLOCK_EXPOSED_"
	ExposedEnvPrefix6 = "AIRLOCK_EXPOSED6_"
)

// ExposedEnvName returns the variable name for an exposed port.
func ExposedEnvName(p control.Port) string { return exposedEnvName(ExposedEnvPrefix, p) }

// exposedEnvName returns the variable name for an exposed port under
// prefix.
func exposedEnvName(prefix string, p control.Port) string {
	n := prefix + strconv.Itoa(int(p.Port))
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
// AIRLOCK_EXPOSED6_ variables, plus one for every port the gateway
// granted, listing its mappings of both families (got:
// control.Lease.Exposed), and the IPv6 alias. It
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
	// Each port's mappings, by family; ports in the order the gateway
	// sent them.
	var order []control.Port
	at := map[control.Port]*[ipfamily.N]netip.AddrPort{}
	for _, x := range got {
		f := ipfamily.Of(x.PublicAddr)
		if f == nil || !want[f.Index][x.Port] || x.PublicPort == 0 {
			return nil, fmt.Errorf("gateway sent an exposure that was not asked for: %s at %v:%d", x.Port, x.PublicAddr, x.PublicPort)
		}
		delete(want[f.Index], x.Port)
		n[f.Index]++
		if at[x.Port] == nil {
			at[x.Port] = new([ipfamily.N]netip.AddrPort)
			order = append(order, x.Port)
		}
		at[x.Port][f.Index] = netip.AddrPortFrom(x.PublicAddr, x.PublicPort)
	}
	if n[ipfamily.V4.Index] != len(asked) {
		return nil, fmt.Errorf("gateway exposed %d ports, asked for %d (is it older than this client?)", n[ipfamily.V4.Index], len(asked))
	}
	var aliases []string
	for _, p := range order {
		var list []string
		for _, ap := range at[p] {
			if ap.IsValid() {
				list = append(list, ap.String())
			}
		}
		out = append(out, exposedEnvName(ExposedEnvPrefix, p)+"="+strings.Join(list, ","))
		if ap := at[p][ipfamily.V6.Index]; ap.IsValid() {
			aliases = append(aliases, exposedEnvName(ExposedEnvPrefix6, p)+"="+ap.String())
		}
	}
	return append(out, aliases...), nil
}
