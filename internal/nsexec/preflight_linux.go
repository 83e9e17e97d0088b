// SPDX-License-Identifier: MIT

package nsexec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	tunPath = "/dev/net/tun"

	sysctlMaxUserNS        = "/proc/sys/user/max_user_namespaces"
	sysctlUnprivUserns     = "/proc/sys/kernel/unprivileged_userns_clone"
	sysctlApparmorRestrict = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
	apparmorLabelPath      = "/proc/self/attr/apparmor/current"

	proxyHint = "or use --mode auto (the default) or seccomp, preload or proxy, which need neither"
)

// hostFacts is what Preflight and the error mapping look at. Empty strings
// mean the sysctl does not exist on this kernel.
type hostFacts struct {
	euid             int
	maxUserNS        string
	unprivUserns     string
	apparmorRestrict string
	apparmorLabel    string

	tunStatErr   error       // from stat(/dev/net/tun)
	tunMode      fs.FileMode // permission bits
	tunAccessErr error       // from access(/dev/net/tun, R_OK|W_OK) as the real user
}

// readHostFacts reads sysctls and stats /dev/net/tun. It is cheap.
func readHostFacts() hostFacts {
	f := hostFacts{
		euid:             os.Geteuid(),
		maxUserNS:        readSysctl(sysctlMaxUserNS),
		unprivUserns:     readSysctl(sysctlUnprivUserns),
		apparmorRestrict: readSysctl(sysctlApparmorRestrict),
		apparmorLabel:    readSysctl(apparmorLabelPath),
	}
	fi, err := os.Stat(tunPath)
	if err != nil {
		f.tunStatErr = err
		return f
	}
	f.tunMode = fi.Mode().Perm()
	if err := unix.Access(tunPath, unix.R_OK|unix.W_OK); err != nil {
		f.tunAccessErr = &fs.PathError{Op: "access", Path: tunPath, Err: err}
	}
	return f
}

func readSysctl(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Preflight checks that this host lets the current user create a user
// namespace with a TUN device in it. It reads sysctls and checks access to
// /dev/net/tun as the real user; it creates nothing. The error, if any, is
// meant for the user: it says what is missing and how to fix it, and matches
// [ErrUserNamespace], [ErrNoTUN] or [ErrTUNPermission].
func Preflight() error {
	return readHostFacts().check()
}

// check is Preflight on given facts.
func (f hostFacts) check() error {
	if err := f.userNSProblem(nil); err != nil {
		return err
	}
	if f.tunStatErr != nil {
		if errors.Is(f.tunStatErr, fs.ErrNotExist) {
			return noTUNError(f.tunStatErr)
		}
		return &hintError{kind: ErrNoTUN, cause: f.tunStatErr,
			msg: fmt.Sprintf("cannot use /dev/net/tun: %v; ask the admin, %s", f.tunStatErr, proxyHint)}
	}
	if f.tunAccessErr != nil {
		return f.tunPermissionError(f.tunAccessErr)
	}
	return nil
}

// userNSProblem returns the error for a sysctl that clearly forbids the
// current user an unprivileged user namespace, or nil.
func (f hostFacts) userNSProblem(cause error) error {
	if f.maxUserNS == "0" {
		return &hintError{kind: ErrUserNamespace, cause: cause,
			msg: "user namespaces are disabled: sysctl user.max_user_namespaces=0; ask the admin to raise it, " + proxyHint}
	}
	if f.euid == 0 {
		return nil // the remaining knobs only restrict unprivileged users
	}
	if f.unprivUserns == "0" {
		return &hintError{kind: ErrUserNamespace, cause: cause,
			msg: "user namespaces are disabled for unprivileged users: sysctl kernel.unprivileged_userns_clone=0; ask the admin to set it to 1, " + proxyHint}
	}
	if f.apparmorRestrict == "1" && (f.apparmorLabel == "" || strings.HasPrefix(f.apparmorLabel, "unconfined")) {
		return &hintError{kind: ErrUserNamespace, cause: cause,
			msg: "user namespaces are restricted by AppArmor: sysctl kernel.apparmor_restrict_unprivileged_userns=1; " +
				"ask the admin to set it to 0 or to install an AppArmor profile for airlock that allows userns, " + proxyHint}
	}
	return nil
}

// userNSError maps an error from creating the namespaces (clone, uid_map,
// or a capability denied inside the new namespace) to a user-facing error.
func (f hostFacts) userNSError(cause error) error {
	if err := f.userNSProblem(cause); err != nil {
		return err
	}
	return &hintError{kind: ErrUserNamespace, cause: cause,
		msg: fmt.Sprintf("cannot create user namespace: %v; check sysctls user.max_user_namespaces (must be > 0), "+
			"kernel.unprivileged_userns_clone (must be 1 where it exists) and kernel.apparmor_restrict_unprivileged_userns "+
			"(must be 0, or airlock needs an AppArmor profile allowing userns); ask the admin, %s", cause, proxyHint)}
}

// tunPermissionError is the error for a /dev/net/tun the user may not open.
func (f hostFacts) tunPermissionError(cause error) error {
	return &hintError{kind: ErrTUNPermission, cause: cause,
		msg: fmt.Sprintf("%v; /dev/net/tun has mode %04o on this host, while most distributions ship it 0666; "+
			"ask the admin to run `chmod 0666 /dev/net/tun` (safe: creating a TUN still needs CAP_NET_ADMIN "+
			"in a network namespace you own), %s", cause, f.tunMode, proxyHint)}
}

func noTUNError(cause error) error {
	return &hintError{kind: ErrNoTUN, cause: cause,
		msg: "no /dev/net/tun: load the tun module (modprobe tun) or ask the admin, " + proxyHint}
}

// isUserNSErrno reports whether err carries an errno that clone(2) or the
// uid_map write returns when user namespaces are unavailable.
func isUserNSErrno(err error) bool {
	for _, e := range []syscall.Errno{unix.EPERM, unix.ENOSPC, unix.EINVAL, unix.EACCES, unix.EUSERS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
