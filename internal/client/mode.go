// SPDX-License-Identifier: MIT

package client

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/nsexec"
	"github.com/airlock-vpn/airlock/internal/seccompnotify"
)

// Mode is how airlock run carries a job's traffic into the tunnel.
type Mode string

// The modes, strongest first. ModeAuto picks the first that works here.
const (
	ModeAuto    Mode = "auto"
	ModeNetns   Mode = "netns"   // own user+net namespace with a TUN: everything
	ModeSeccomp Mode = "seccomp" // seccomp user notification catches connect()
	ModePreload Mode = "preload" // LD_PRELOAD library plus proxy variables
	ModeProxy   Mode = "proxy"   // proxy variables only
)

// fallbackOrder is the order auto tries the modes in.
var fallbackOrder = []Mode{ModeNetns, ModeSeccomp, ModePreload, ModeProxy}

// ParseMode checks a --mode value; "" means auto.
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return ModeAuto, nil
	}
	m := Mode(s)
	switch m {
	case ModeAuto, ModeNetns, ModeSeccomp, ModePreload, ModeProxy:
		return m, nil
	}
	return "", fmt.Errorf("bad --mode %q: want auto, netns, seccomp, preload or proxy", s)
}

// fallbackFUSE is what the preload and proxy modes allow for FUSE: the
// job keeps the node's namespaces and may run setuid programs, so the
// node's fusermount3 works as without airlock.
const fallbackFUSE = "FUSE mounts (fusermount3) as on the node"

// covers says what a mode covers and what it does not, for the one line
// airlock run prints.
func (m Mode) covers() string {
	switch m {
	case ModeNetns:
		return "every program and protocol of the job goes through the tunnel; FUSE mounts (fusermount3) through airlock's stand-in, containers sharing the job's network too"
	case ModeSeccomp:
		return "connect() of every process goes through the tunnel, static binaries included; " +
			"not covered: UDP sent with sendto/sendmsg on unconnected sockets, raw sockets and ping, 32-bit programs; " +
			"FUSE mounts through fusermount3 fail (the filter needs no_new_privs, which disarms setuid programs)"
	case ModePreload:
		return "dynamically linked programs go through the tunnel (TCP, UDP, DNS) by LD_PRELOAD, others through the proxy variables; " +
			"not covered: statically linked programs (e.g. Go binaries), programs that clear LD_PRELOAD, raw sockets and ping; " +
			fallbackFUSE
	case ModeProxy:
		return "only programs that honour http_proxy, https_proxy or ALL_PROXY go through the tunnel; nothing else is intercepted; " +
			fallbackFUSE
	}
	return ""
}

// PreloadLibrary is the file name of the LD_PRELOAD library.
const PreloadLibrary = "libairlock-preload.so"

// findPreload returns the preload library: explicit (--preload or
// AIRLOCK_PRELOAD), else next to the airlock binary, else in
// ../lib/airlock/ from it.
func findPreload(explicit string) (string, error) {
	check := func(p string) (string, error) {
		abs, err := filepath.Abs(p)
		if err != nil {
			return "", err
		}
		if err := unix.Access(abs, unix.R_OK); err != nil {
			return "", fmt.Errorf("preload library %s: %w", abs, err)
		}
		return abs, nil
	}
	if explicit != "" {
		return check(explicit)
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find own executable: %w", err)
	}
	dir := filepath.Dir(exe)
	var tried []string
	for _, p := range []string{filepath.Join(dir, PreloadLibrary), filepath.Join(dir, "..", "lib", "airlock", PreloadLibrary)} {
		if abs, err := check(p); err == nil {
			return abs, nil
		}
		tried = append(tried, p)
	}
	return "", fmt.Errorf("no %s (looked in %s); build it with 'make -C preload' and put it next to airlock, or pass --preload PATH",
		PreloadLibrary, strings.Join(tried, ", "))
}

// seccompAvailable reports whether the kernel has seccomp user
// notification with fd injection (Linux 5.9). The shim's attempt to
// install the filter is the final word; this only saves starting it.
func seccompAvailable() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	if _, err := fmt.Sscanf(rel, "%d.%d", &major, &minor); err != nil {
		return fmt.Errorf("cannot parse kernel release %q", rel)
	}
	if major < 5 || (major == 5 && minor < 9) {
		return fmt.Errorf("kernel %s is older than 5.9 (seccomp fd injection)", rel)
	}
	// The supervisor looks at the job's sockets with pidfd_getfd, which
	// needs ptrace access: Yama's scope 2 and 3 deny it to unprivileged
	// users even for their own children. (Scope 1 allows it for
	// descendants, which the job's processes stay: airlock run is their
	// subreaper.)
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil {
		if v := strings.TrimSpace(string(b)); v == "2" || v == "3" {
			return fmt.Errorf("sysctl kernel.yama.ptrace_scope=%s forbids inspecting the job's sockets (pidfd_getfd)", v)
		}
	}
	return nil
}

// plan is the modes still to try, with why the stronger ones were skipped.
type plan struct {
	requested Mode
	next      []Mode
	why       []string // "netns: …" for every mode skipped so far
	// note, if not "", is what airlock run changed in the job's
	// environment (jobProxyEnv), said on the line of the modes that
	// keep that environment.
	note string
}

// newPlan starts a plan for the requested mode: just that mode, or for
// auto the fallback order.
func newPlan(m Mode) *plan {
	if m == ModeAuto {
		return &plan{requested: m, next: append([]Mode(nil), fallbackOrder...)}
	}
	return &plan{requested: m, next: []Mode{m}}
}

// current is the mode to try now ("" when none is left).
func (p *plan) current() Mode {
	if len(p.next) == 0 {
		return ""
	}
	return p.next[0]
}

// skip records that the current mode does not work here. It returns err
// (to fail with) if the mode was asked for explicitly, or nil when there is
// a next mode to try.
func (p *plan) skip(err error) error {
	m := p.current()
	p.why = append(p.why, fmt.Sprintf("%s unavailable: %s", m, shortReason(err)))
	p.next = p.next[1:]
	if p.requested != ModeAuto || len(p.next) == 0 {
		return fmt.Errorf("--mode %s: %w", m, err)
	}
	return nil
}

// shortReason is err's message up to its first "; " (where user-facing
// errors start their advice, which belongs to explicit modes), without a
// repeated "unavailable" prefix.
func shortReason(err error) string {
	s, _, _ := strings.Cut(err.Error(), "; ")
	s = strings.TrimPrefix(s, seccompnotify.ErrUnavailable.Error()+": ")
	return s
}

// line is the one line airlock run prints about the mode it runs the job in.
func (p *plan) line() string {
	m := p.current()
	s := fmt.Sprintf("airlock: mode %s", m)
	if m != ModeNetns {
		if len(p.why) > 0 {
			s += " (" + strings.Join(p.why, "; ") + ")"
		} else {
			s += " (asked for)"
		}
	}
	s += ": " + m.covers()
	if p.note != "" && m != ModePreload && m != ModeProxy {
		s += "; " + p.note
	}
	return s
}

// namespaceUnavailable reports whether err from preparing or starting the
// netns mode means this host does not allow it (so auto may fall back),
// rather than a failure of the job or of airlock.
func namespaceUnavailable(err error) bool {
	return errors.Is(err, nsexec.ErrUserNamespace) || errors.Is(err, nsexec.ErrNoTUN) || errors.Is(err, nsexec.ErrTUNPermission)
}
