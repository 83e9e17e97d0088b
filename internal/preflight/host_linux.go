// SPDX-License-Identifier: MIT

package preflight

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Host is the machine the checks look at. System returns the real one;
// tests replace fields. Its zero value is not usable.
type Host struct {
	// ProcSys is the sysctl tree, normally /proc/sys.
	ProcSys string
	// TUN is the TUN clone device, normally /dev/net/tun.
	TUN string
	// FUSE is the FUSE device, normally /dev/fuse.
	FUSE string
	// UID and GID are who jobs or the gateway run as.
	UID, GID int
	// NewUserNS creates (and leaves) a user and network namespace, as
	// airlock does, returning why it cannot.
	NewUserNS func() error
	// NOFILE returns RLIMIT_NOFILE's soft and hard limits.
	NOFILE func() (soft, hard uint64, err error)
}

// System returns the running machine, as the calling user.
func System() *Host {
	return &Host{
		ProcSys: "/proc/sys",
		TUN:     "/dev/net/tun",
		FUSE:    "/dev/fuse",
		UID:     os.Getuid(),
		GID:     os.Getgid(),
		NewUserNS: func() error {
			true_, err := exec.LookPath("true")
			if err != nil {
				true_ = "/bin/true"
			}
			cmd := exec.Command(true_)
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET | syscall.CLONE_NEWNS,
				UidMappings:                []syscall.SysProcIDMap{{ContainerID: os.Getuid(), HostID: os.Getuid(), Size: 1}},
				GidMappings:                []syscall.SysProcIDMap{{ContainerID: os.Getgid(), HostID: os.Getgid(), Size: 1}},
				GidMappingsEnableSetgroups: false,
			}
			return cmd.Run()
		},
		NOFILE: func() (uint64, uint64, error) {
			var r unix.Rlimit
			err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r)
			return r.Cur, r.Max, err
		},
	}
}

// sysctl reads a sysctl by its dotted name; ok is false if it does not
// exist.
func (h *Host) sysctl(name string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(h.ProcSys, strings.ReplaceAll(name, ".", "/")))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

// UserNamespaces checks that the user can create a user and network
// namespace. miss is the verdict when not (Warn where a fallback exists).
func (h *Host) UserNamespaces(miss Status, fallback string) Result {
	r := Result{Name: "user namespaces", Status: miss}
	if v, ok := h.sysctl("kernel.unprivileged_userns_clone"); ok && v == "0" {
		r.Detail = "disabled: kernel.unprivileged_userns_clone=0" + fallback
		r.Fix = "sysctl -w kernel.unprivileged_userns_clone=1 (persist in /etc/sysctl.d/)"
		return r
	}
	if v, ok := h.sysctl("user.max_user_namespaces"); ok && v == "0" {
		r.Detail = "disabled: user.max_user_namespaces=0" + fallback
		r.Fix = "sysctl -w user.max_user_namespaces=15000 (persist in /etc/sysctl.d/)"
		return r
	}
	if err := h.NewUserNS(); err != nil {
		r.Detail = fmt.Sprintf("cannot create one: %v%s", err, fallback)
		r.Fix = "allow unprivileged user namespaces (kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0"
		if v, ok := h.sysctl("kernel.apparmor_restrict_unprivileged_userns"); ok && v == "1" {
			r.Fix += ", kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for airlock"
		}
		r.Fix += ")"
		return r
	}
	return Result{Name: "user namespaces", Status: OK, Detail: "a user and network namespace can be created"}
}

// NestedUserNamespaces reports whether a job may start containers of its
// own (bubblewrap, unshare -U, rootless podman, Apptainer's unprivileged
// mode): each needs a user namespace inside the job's, and
// user.max_user_namespaces counts the user's namespaces on the node
// (airlock's one per job, plus one per container).
func (h *Host) NestedUserNamespaces() Result {
	r := Result{Name: "containers in jobs", Status: OK,
		Detail: "user namespaces inside the job's are allowed (bubblewrap, unshare -U, rootless podman reach the outside through the tunnel)"}
	v, ok := h.sysctl("user.max_user_namespaces")
	if !ok {
		return r
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n >= 16 {
		r.Detail += fmt.Sprintf("; user.max_user_namespaces=%s", v)
		return r
	}
	r.Status = Warn
	r.Detail = fmt.Sprintf("user.max_user_namespaces=%d: each job takes one and each container it starts another, counted for all of the user's jobs on the node", n)
	r.Fix = "sysctl -w user.max_user_namespaces=15000 (the kernel's usual default; persist in /etc/sysctl.d/)"
	return r
}

// FUSEDevice reports whether jobs can mount FUSE file systems
// (squashfuse, cvmfsexec, sshfs): /dev/fuse must open for the user, as on
// the bare node; then fusermount3 works inside netns-mode jobs through
// airlock's stand-in (internal/fusemount).
func (h *Host) FUSEDevice() Result {
	r := Result{Name: h.FUSE, Status: Warn}
	fi, err := os.Stat(h.FUSE)
	if err != nil {
		r.Detail = "missing: FUSE mounts (squashfuse, cvmfsexec) fail in jobs, as on this node without airlock"
		r.Fix = "modprobe fuse, if jobs need FUSE"
		return r
	}
	f, err := os.OpenFile(h.FUSE, os.O_RDWR, 0)
	if err != nil {
		r.Detail = fmt.Sprintf("mode %04o, cannot open it (%v): FUSE mounts fail in jobs, as on this node without airlock", fi.Mode().Perm(), errors.Unwrap(err))
		r.Fix = "chmod 0666 " + h.FUSE + " (most distributions' default), if jobs need FUSE"
		return r
	}
	f.Close()
	return Result{Name: h.FUSE, Status: OK, Detail: "opens read-write: fusermount3 (squashfuse, cvmfsexec) works in jobs through airlock's stand-in (--mode netns; not in the fallback modes)"}
}

// TUN checks that the user can open the TUN clone device read-write.
func (h *Host) TUNDevice(miss Status, fallback string) Result {
	r := Result{Name: h.TUN, Status: miss}
	fi, err := os.Stat(h.TUN)
	if err != nil {
		r.Detail = fmt.Sprintf("missing: %v%s", err, fallback)
		r.Fix = "load the tun module (modprobe tun) and create the device (mknod /dev/net/tun c 10 200; chmod 0666 /dev/net/tun)"
		return r
	}
	if fi.Mode()&os.ModeCharDevice == 0 {
		r.Detail = "not a character device" + fallback
		r.Fix = "recreate it: mknod /dev/net/tun c 10 200; chmod 0666 /dev/net/tun"
		return r
	}
	f, err := os.OpenFile(h.TUN, os.O_RDWR, 0)
	if err != nil {
		r.Detail = fmt.Sprintf("cannot open it read-write (mode %04o): %v%s", fi.Mode().Perm(), errors.Unwrap(err), fallback)
		r.Fix = "chmod 0666 /dev/net/tun (persist with a udev rule: KERNEL==\"tun\", MODE=\"0666\"); creating a TUN still needs a namespace the user owns, so this grants nothing on the host"
		return r
	}
	f.Close()
	return Result{Name: h.TUN, Status: OK, Detail: fmt.Sprintf("opens read-write (mode %04o)", fi.Mode().Perm())}
}

// PingGroup checks that the user's group may open ICMP ping sockets
// (net.ipv4.ping_group_range), which a user-mode gateway needs to relay
// jobs' pings.
func (h *Host) PingGroup() Result {
	r := Result{Name: "net.ipv4.ping_group_range", Status: Warn}
	v, ok := h.sysctl("net.ipv4.ping_group_range")
	f := strings.Fields(v)
	if !ok || len(f) != 2 {
		r.Detail = fmt.Sprintf("unreadable (%q); jobs' ping will not be relayed", v)
		r.Fix = `sysctl -w net.ipv4.ping_group_range="0 2147483647"`
		return r
	}
	lo, err1 := strconv.ParseInt(f[0], 10, 64)
	hi, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 == nil && err2 == nil && lo <= int64(h.GID) && int64(h.GID) <= hi {
		return Result{Name: r.Name, Status: OK, Detail: fmt.Sprintf("%d-%d includes group %d: jobs' ping is relayed", lo, hi, h.GID)}
	}
	r.Detail = fmt.Sprintf("%s %s excludes group %d: jobs' ping gets no answer (everything else works)", f[0], f[1], h.GID)
	r.Fix = fmt.Sprintf(`sysctl -w net.ipv4.ping_group_range="%d %d" (or "0 2147483647"; persist in /etc/sysctl.d/)`, h.GID, h.GID)
	return r
}

// PortBlocks checks a user-mode gateway's egress ports (lo-hi; 0-0 means
// the default, the whole local port range) against
// net.ipv4.ip_local_port_range and says how many blocks of size ports,
// i.e. concurrent jobs, it makes.
func (h *Host) PortBlocks(lo, hi uint16, size int) Result {
	r := Result{Name: "net.ipv4.ip_local_port_range", Status: Problem}
	v, _ := h.sysctl("net.ipv4.ip_local_port_range")
	f := strings.Fields(v)
	if len(f) != 2 {
		r.Detail = fmt.Sprintf("unreadable (%q)", v)
		r.Fix = "check /proc/sys/net/ipv4/ip_local_port_range"
		return r
	}
	llo, err1 := strconv.Atoi(f[0])
	lhi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		r.Detail = fmt.Sprintf("unreadable (%q)", v)
		return r
	}
	if lo == 0 && hi == 0 {
		lo, hi = uint16(llo), uint16(lhi)
	}
	if int(lo) < llo || int(hi) > lhi {
		r.Detail = fmt.Sprintf("egress ports %d-%d reach outside the local port range %d-%d; a user-mode gateway can bind only inside it", lo, hi, llo, lhi)
		r.Fix = fmt.Sprintf(`choose --egress-ports inside %d-%d, or widen it: sysctl -w net.ipv4.ip_local_port_range="%d %d"`, llo, lhi, min(llo, int(lo)), max(lhi, int(hi)))
		return r
	}
	n := (int(hi) - int(lo) + 1) / max(size, 1)
	switch {
	case n < 1:
		r.Detail = fmt.Sprintf("egress ports %d-%d hold no block of %d ports: no job can join", lo, hi, size)
		r.Fix = "widen --egress-ports or lower --block-size"
	case n < 16:
		r.Status = Warn
		r.Detail = fmt.Sprintf("egress ports %d-%d make only %d blocks of %d: at most %d jobs at once", lo, hi, n, size, n)
		r.Fix = "widen --egress-ports (and ip_local_port_range) or lower --block-size"
	default:
		r.Status = OK
		r.Detail = fmt.Sprintf("egress ports %d-%d inside %d-%d: %d blocks of %d ports, at most %d jobs at once", lo, hi, llo, lhi, n, size, n)
	}
	return r
}

// OpenFiles checks RLIMIT_NOFILE's hard limit (Go raises the soft limit to
// it at start): below need is a problem, below want a warning.
func (h *Host) OpenFiles(need, want uint64, why string) Result {
	r := Result{Name: "RLIMIT_NOFILE"}
	soft, hard, err := h.NOFILE()
	if err != nil {
		r.Status, r.Detail = Problem, fmt.Sprintf("getrlimit: %v", err)
		return r
	}
	r.Detail = fmt.Sprintf("soft %d, hard %d (%s)", soft, hard, why)
	switch {
	case hard < need:
		r.Status = Problem
	case hard < want:
		r.Status = Warn
	default:
		return r
	}
	r.Fix = fmt.Sprintf("raise the hard limit to at least %d: LimitNOFILE=%d in the systemd unit, or nofile in /etc/security/limits.conf, or ulimit -Hn", want, want)
	return r
}
