// SPDX-License-Identifier: MIT

package topology

// Unprivileged commands and /dev/net/tun.
//
// Theory of operation: a fresh Debian machine (and this project's CI) has
// /dev/net/tun at mode 0600, while most distributions ship it 0666. The
// harness never changes the host's device: a chmod is global, so test
// processes running at the same time (go test runs packages as separate
// processes; several developers share a machine) would race to set and
// restore it, and a killed test would leave it 0666. Instead a [TUNNode]
// is a device node of the same character device with a mode of its own,
// made by root in a directory that only root can reach, and
// [TUNNode.Command] runs a command in a new mount namespace in which that
// node is bind-mounted over /dev/net/tun before the command starts, as
// the given user. The mount namespace is a slave of the caller's, so
// nothing mounted in it reaches the host, and it dies with its last
// process: nothing is left to restore. Inside `ip netns exec` (which makes
// a mount namespace of its own) the bind mount happens after it, in a
// nested one.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TUNPath is the TUN clone device.
const TUNPath = "/dev/net/tun"

// UserTUNMode is the mode of /dev/net/tun that unprivileged commands of
// the harness see (what most distributions ship): any user may open it,
// and creating a TUN still needs CAP_NET_ADMIN in a namespace the user
// owns.
const UserTUNMode os.FileMode = 0o666

// TUNNode is the path of a device node of the TUN clone device, in a
// directory of its own that only root can reach. The zero value is not
// usable; make one with [NewTUNNode].
type TUNNode string

// NewTUNNode makes a node of /dev/net/tun's device with the given
// permission bits in a new directory, removed at t's cleanup. It needs
// root; it skips or fails t like [RequireRoot] otherwise.
func NewTUNNode(t testing.TB, mode os.FileMode) TUNNode {
	t.Helper()
	RequireRoot(t)
	node, err := newDeviceNode(TUNPath, mode)
	if err != nil {
		t.Fatalf("NewTUNNode: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(node)) })
	return TUNNode(node)
}

// newDeviceNode makes a node of the character device at path with the
// given permission bits in a new directory only root can reach, and
// returns the node's path.
func newDeviceNode(path string, mode os.FileMode) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	dir, err := os.MkdirTemp("", "airlock-dev-") // 0700
	if err != nil {
		return "", err
	}
	node := filepath.Join(dir, filepath.Base(path))
	if err := unix.Mknod(node, unix.S_IFCHR|uint32(mode.Perm()), int(st.Rdev)); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("mknod %s: %w", node, err)
	}
	if err := os.Chmod(node, mode.Perm()); err != nil { // undo the umask
		os.RemoveAll(dir)
		return "", err
	}
	return node, nil
}

// bindOver returns the argv that runs argv with node bind-mounted over
// path in a new mount namespace, a slave of the caller's.
func bindOver(node, path string, argv ...string) []string {
	out := []string{"unshare", "--mount", "--propagation", "slave", "--",
		"sh", "-c", `mount --bind "$0" ` + path + ` && exec "$@"`, node}
	return append(out, argv...)
}

// Command returns the argv that runs argv with n bind-mounted over
// /dev/net/tun in a new mount namespace, as u (nil: as the caller). The
// command keeps the caller's process id (every step execs the next) and
// its parent-death signal. It must be started as root.
func (n TUNNode) Command(u *User, argv ...string) []string {
	if u != nil {
		argv = append(u.setpriv(), argv...)
	}
	return bindOver(string(n), TUNPath, argv...)
}

// setpriv returns the argv prefix that runs the rest as u, without
// supplementary groups and keeping the parent-death signal (which a change
// of uid would otherwise clear).
func (u *User) setpriv() []string {
	return []string{"setpriv", "--reuid=" + strconv.Itoa(u.UID), "--regid=" + strconv.Itoa(u.GID),
		"--clear-groups", "--pdeathsig=keep", "--"}
}

// FUSEPath is the FUSE device.
const FUSEPath = "/dev/fuse"

// FUSENode is, like TUNNode, a node of /dev/fuse's device with a mode of
// its own in a directory only root can reach, for tests of FUSE inside
// jobs on a host whose /dev/fuse is 0600 (most distributions ship it
// 0666). Make one with [NewFUSENode].
type FUSENode string

// NewFUSENode makes a node of /dev/fuse's device with the given
// permission bits, removed at t's cleanup. It skips t if the host has no
// /dev/fuse.
func NewFUSENode(t testing.TB, mode os.FileMode) FUSENode {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat(FUSEPath); err != nil {
		t.Skipf("NewFUSENode: no FUSE on this host: %v", err)
	}
	node, err := newDeviceNode(FUSEPath, mode)
	if err != nil {
		t.Fatalf("NewFUSENode: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(node)) })
	return FUSENode(node)
}

// Wrap returns the argv that runs argv (which starts as root, e.g.
// TUNNode.Command's) with n bind-mounted over /dev/fuse in a new mount
// namespace, a slave of the caller's.
func (n FUSENode) Wrap(argv ...string) []string { return bindOver(string(n), FUSEPath, argv...) }

// WithUserFUSE gives commands run as a user a /dev/fuse of mode 0666, as
// most distributions ship it (FUSENode), whatever the host's mode.
func WithUserFUSE() Option { return func(o *options) { o.fuse = true } }
