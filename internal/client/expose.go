// SPDX-License-Identifier: MIT

package client

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
)

// ExposedEnvPrefix starts the names of the variables that tell a job where
// its exposed ports are reachable: AIRLOCK_EXPOSED_<PORT>=IP:PUBPORT for
// TCP, AIRLOCK_EXPOSED_<PORT>_UDP=IP:PUBPORT for UDP.
const ExposedEnvPrefix = "AIRLOCK_EXPOSED_"

// ExposedEnvName returns the variable name for an exposed port.
func ExposedEnvName(p control.Port) string {
	n := ExposedEnvPrefix + strconv.Itoa(int(p.Port))
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

// exposedEnv returns env without inherited AIRLOCK_EXPOSED_ variables,
// plus one for every mapping the gateway granted. It fails unless the
// gateway granted exactly the ports asked for.
func exposedEnv(env []string, asked []control.Port, got []control.Exposed) ([]string, error) {
	want := map[control.Port]bool{}
	for _, p := range asked {
		want[p] = true
	}
	if len(got) != len(asked) {
		return nil, fmt.Errorf("gateway exposed %d ports, asked for %d (is it older than this client?)", len(got), len(asked))
	}
	out := make([]string, 0, len(env)+len(got))
	for _, kv := range env {
		if !strings.HasPrefix(kv, ExposedEnvPrefix) {
			out = append(out, kv)
		}
	}
	for _, x := range got {
		if !want[x.Port] || !x.PublicAddr.IsValid() || x.PublicPort == 0 {
			return nil, fmt.Errorf("gateway sent an exposure that was not asked for: %s at %v:%d", x.Port, x.PublicAddr, x.PublicPort)
		}
		delete(want, x.Port)
		out = append(out, ExposedEnvName(x.Port)+"="+netip.AddrPortFrom(x.PublicAddr, x.PublicPort).String())
	}
	return out, nil
}
