// SPDX-License-Identifier: MIT

package client

import (
	"fmt"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
)

// Variables that tell a job its egress port block: its outside
// connections leave from EgressAddrEnv with a source port in
// EgressPortsEnv (LO-HI), as the gateway's whois records them.
const (
	EgressAddrEnv  = "AIRLOCK_EGRESS_ADDR"
	EgressPortsEnv = "AIRLOCK_EGRESS_PORTS"
)

// MaxPorts bounds --ports: a job cannot hold more than a port space.
const MaxPorts = 65535

// checkPorts validates --ports before joining.
func checkPorts(n int) error {
	if n < 0 || n > MaxPorts {
		return fmt.Errorf("bad --ports %d: want 0 (the gateway's block size) to %d", n, MaxPorts)
	}
	return nil
}

// portsEnv returns env without inherited AIRLOCK_EGRESS_ variables, plus
// the lease's egress address and port block if it has one. It fails if
// the gateway granted fewer ports than the job asked for.
func portsEnv(env []string, asked int, ls control.Lease) ([]string, error) {
	n := 0
	if ls.Ports[1] >= ls.Ports[0] && ls.Ports[0] > 0 {
		n = int(ls.Ports[1]) - int(ls.Ports[0]) + 1
	}
	if asked > 0 && n < asked {
		return nil, fmt.Errorf("gateway granted %d egress ports, asked for %d with --ports (is it older than this client?)", n, asked)
	}
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		if !strings.HasPrefix(kv, EgressAddrEnv+"=") && !strings.HasPrefix(kv, EgressPortsEnv+"=") && !strings.HasPrefix(kv, EgressFileEnv+"=") {
			out = append(out, kv)
		}
	}
	if n == 0 {
		return out, nil
	}
	if a := publicAddr4(ls); a.IsValid() {
		out = append(out, EgressAddrEnv+"="+a.String())
	}
	return append(out, fmt.Sprintf("%s=%d-%d", EgressPortsEnv, ls.Ports[0], ls.Ports[1])), nil
}
