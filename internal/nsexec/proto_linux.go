// SPDX-License-Identifier: MIT

package nsexec

import (
	"fmt"
	"net/netip"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/reexec"
)

// Environment variables between Start and the namespace child. Everything
// with envPrefix is removed from the job's environment.
const (
	envPrefix = "AIRLOCK_NSEXEC_"
	envConfig = envPrefix + "CONFIG" // "fd:N", the pipe of the JSON childConfig (reexec.StartDeferred); its presence selects the child in Init
	envFD     = envPrefix + "FD"     // names the socketpair descriptor in the child (reexec)
	childArg0 = "airlock-nsexec"     // argv[0] of the child; argv[1:] is the job's command
)

// Setup steps named in child errors.
const (
	stepConfig  = "decode namespace config"
	stepMounts  = "make mounts private"
	stepTUN     = "create tun in job namespace"
	stepNetwork = "configure tun in job namespace"
	stepResolv  = "bind resolv.conf in job namespace"
)

// childConfig is what the child needs to set up the namespace.
type childConfig struct {
	TUNName  string         `json:"tun"`
	Addrs    []netip.Prefix `json:"addrs"`
	Gateways []netip.Addr   `json:"gateways"`
	MTU      int            `json:"mtu"`
	DNS      []netip.Addr   `json:"dns"`
	// Env is the job's environment (without envPrefix variables).
	Env []string `json:"env"`
}

// setupError maps a child's reply to the error Start returns.
func (f hostFacts) setupError(r reexec.Reply) error {
	cause := &reexec.ChildError{Reply: r}
	errno := syscall.Errno(r.Errno)
	switch {
	case r.Step == stepTUN && r.Op == "open" && (errno == unix.EACCES || errno == unix.EPERM):
		return f.tunPermissionError(cause)
	case r.Step == stepTUN && r.Op == "open" && (errno == unix.ENOENT || errno == unix.ENODEV || errno == unix.ENXIO):
		return noTUNError(cause)
	case errno == unix.EPERM && (r.Step == stepMounts || r.Step == stepTUN || r.Step == stepNetwork || r.Step == stepResolv):
		// Capabilities in our own user namespace were refused: AppArmor or
		// another LSM restricts unprivileged user namespaces.
		return f.userNSError(cause)
	}
	return &hintError{kind: ErrSetup, cause: cause, msg: fmt.Sprintf("set up job namespace: %v", cause)}
}

// jobEnv returns env without airlock's internal variables.
func jobEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, envPrefix) {
			out = append(out, kv)
		}
	}
	return out
}
