package nsexec

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Environment variables between Start and the namespace child. Everything
// with envPrefix is removed from the job's environment.
const (
	envPrefix = "AIRLOCK_NSEXEC_"
	envConfig = envPrefix + "CONFIG" // JSON childConfig; its presence selects the child in Init
	envFD     = envPrefix + "FD"     // number of the socketpair descriptor in the child
	childFD   = 3                    // first of cmd.ExtraFiles
	childArg0 = "airlock-nsexec"     // argv[0] of the child; argv[1:] is the job's command

	goByte      = 'g'      // parent → child: exec the command
	maxReplyLen = 64 << 10 // bound on a child's reply message
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
	TUNName string       `json:"tun"`
	Address netip.Prefix `json:"address"`
	Gateway netip.Addr   `json:"gateway"`
	MTU     int          `json:"mtu"`
	DNS     []netip.Addr `json:"dns"`
	// Address6 and Gateway6: the job's IPv6 side (Config).
	Address6 netip.Prefix `json:"address6,omitzero"`
	Gateway6 netip.Addr   `json:"gateway6,omitzero"`
}

// setupReply is the child's one message to the parent. An empty Step means
// success; the TUN fd is then attached with SCM_RIGHTS.
type setupReply struct {
	Step  string `json:"step,omitempty"`
	Op    string `json:"op,omitempty"`    // "open" when opening /dev/net/tun failed
	Err   string `json:"err,omitempty"`   // error text
	Errno int    `json:"errno,omitempty"` // innermost errno, 0 if none
}

// stepError is a setup failure in the child.
type stepError struct {
	step string
	op   string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func replyFor(err error) setupReply {
	r := setupReply{Step: stepConfig, Err: err.Error()}
	var se *stepError
	if errors.As(err, &se) {
		r.Step, r.Op, r.Err = se.step, se.op, se.err.Error()
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		r.Errno = int(errno)
	}
	return r
}

// childSetupError is the parent's view of a child's setup failure.
type childSetupError struct{ r setupReply }

func (e *childSetupError) Error() string { return e.r.Step + ": " + e.r.Err }

func (e *childSetupError) Unwrap() error {
	if e.r.Errno == 0 {
		return nil
	}
	return syscall.Errno(e.r.Errno)
}

// setupError maps a child's reply to the error Start returns.
func (f hostFacts) setupError(r setupReply) error {
	cause := &childSetupError{r}
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
