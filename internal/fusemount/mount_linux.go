// SPDX-License-Identifier: MIT

package fusemount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// fuseDev is the FUSE device.
const fuseDev = "/dev/fuse"

// caller is who asks for a mount: ids as seen in the job's user
// namespace. root (uid 0 of the namespace that mounts) skips the
// mount point checks, as fusermount3 does for root.
type caller struct{ uid, gid int }

// checkMountPoint makes fusermount3's checks of a user's mount point,
// given as a descriptor (O_PATH) the caller opened: a directory or
// regular file the caller may write, not in a sticky directory it does
// not own, on a file system users may mount over. It returns the mount
// point's mode.
func checkMountPoint(fd int, c caller) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat mount point: %w", err)
	}
	mode := st.Mode & unix.S_IFMT
	if mode != unix.S_IFDIR && mode != unix.S_IFREG {
		return 0, errors.New("mount point is not a directory or a regular file")
	}
	if c.uid == 0 {
		return st.Mode, nil
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return 0, fmt.Errorf("statfs mount point: %w", err)
	}
	if _, ok := allowedFSTypes[int64(uint32(sfs.Type))]; !ok {
		return 0, fmt.Errorf("mounting over a file system of type %#x is forbidden", uint32(sfs.Type))
	}
	if st.Mode&unix.S_ISVTX != 0 && int(st.Uid) != c.uid {
		return 0, errors.New("mount point in a sticky directory is not owned by the user")
	}
	var w bool
	switch {
	case int(st.Uid) == c.uid:
		w = st.Mode&0o200 != 0
	case int(st.Gid) == c.gid:
		w = st.Mode&0o020 != 0
	default:
		w = st.Mode&0o002 != 0
	}
	if !w {
		return 0, errors.New("user has no write access to mountpoint")
	}
	return st.Mode, nil
}

// mount opens /dev/fuse and mounts it on the mount point mpFD for c with
// the -o list opts; it returns the /dev/fuse descriptor (close-on-exec)
// for the file system's daemon.
func mount(mpFD int, opts string, c caller) (int, error) {
	conf, _ := os.ReadFile(fuseConf)
	o, err := parseOptions(opts, userAllowOther(conf))
	if err != nil {
		return -1, err
	}
	mode, err := checkMountPoint(mpFD, c)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Open(fuseDev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", fuseDev, err)
	}
	target := "/proc/self/fd/" + strconv.Itoa(mpFD)
	if err := unix.Mount(o.source(fuseDev), target, o.fsType(), o.flags, o.kernelData(fd, mode, c.uid, c.gid)); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EINVAL) {
			return -1, fmt.Errorf("mount failed: %w (a mount point in another mount namespace, e.g. inside a container the job started, is not reachable: mount before starting the container)", err)
		}
		return -1, fmt.Errorf("mount failed: %w", err)
	}
	return fd, nil
}

// checkUnmount checks that mpFD, a descriptor the caller opened, is the
// root of a FUSE mount that c mounted (its user_id) or that c is root,
// and returns the mount's path and id for unmount. The caller closes mpFD
// before unmount: an open descriptor keeps the mount busy.
func checkUnmount(mpFD int, c caller) (path, id string, err error) {
	id, err = mountID(mpFD)
	if err != nil {
		return "", "", err
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", err
	}
	line, ok := mountInfoLine(mi, id)
	if !ok {
		return "", "", errors.New("not mounted")
	}
	// mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS...] - FSTYPE SOURCE SUPEROPTS
	f := strings.Fields(line)
	sep := -1
	for i, x := range f {
		if x == "-" {
			sep = i
			break
		}
	}
	if sep < 5 || len(f) < sep+2 {
		return "", "", errors.New("cannot read /proc/self/mountinfo")
	}
	mp := unescapeMountInfo(f[4])
	if p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(mpFD)); err != nil || p != mp {
		return "", "", fmt.Errorf("%s is not a mount point", p)
	}
	fstype := f[sep+1]
	if fstype != "fuse" && !strings.HasPrefix(fstype, "fuse.") && fstype != "fuseblk" {
		return "", "", fmt.Errorf("%s is not a FUSE mount (%s)", mp, fstype)
	}
	if c.uid != 0 {
		owner := ""
		if sep+3 < len(f) {
			for _, o := range strings.Split(f[sep+3], ",") {
				if v, ok := strings.CutPrefix(o, "user_id="); ok {
					owner = v
				}
			}
		}
		if owner != strconv.Itoa(c.uid) {
			return "", "", fmt.Errorf("entry for %s not found or mounted by another user (user_id=%s)", mp, owner)
		}
	}
	return mp, id, nil
}

// unmountPath unmounts the FUSE mount at path (absolute) for c, if c
// mounted it; lazy is -z. It holds no descriptor of the mount while it
// unmounts (one would keep the mount busy).
func unmountPath(path string, lazy bool, c caller) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bad mount point %s: %w", path, err)
	}
	mp, id, err := checkUnmount(fd, c)
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unmount(mp, id, lazy)
}

// cwdMu serializes unmounts, which change the process's working
// directory.
var cwdMu sync.Mutex

// unmount unmounts the mount with id at path, as fusermount3 does: from
// its parent directory (so no symbolic link on the way is followed after
// the check), checking that the last component is still that mount; lazy
// is -z (MNT_DETACH).
func unmount(path, id string, lazy bool) error {
	cwdMu.Lock()
	defer cwdMu.Unlock()
	dir, last := filepath.Split(path)
	if last == "" {
		return errors.New("cannot unmount /")
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	if err := unix.Fchdir(dfd); err != nil {
		return fmt.Errorf("chdir %s: %w", dir, err)
	}
	defer unix.Chdir("/")
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, last, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &stx); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if strconv.FormatUint(stx.Mnt_id, 10) != id {
		return fmt.Errorf("%s changed while being unmounted", path)
	}
	flags := unix.UMOUNT_NOFOLLOW
	if lazy {
		flags |= unix.MNT_DETACH
	}
	if err := unix.Unmount(last, flags); err != nil {
		return fmt.Errorf("failed to unmount %s: %w", path, err)
	}
	return nil
}

// mountID is the mount id of the mount fd is on (/proc/self/fdinfo).
func mountID(fd int) (string, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "mnt_id:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New("no mnt_id in fdinfo")
}

func mountInfoLine(mi []byte, id string) (string, bool) {
	for _, l := range strings.Split(string(mi), "\n") {
		if x, _, ok := strings.Cut(l, " "); ok && x == id {
			return l, true
		}
	}
	return "", false
}

// unescapeMountInfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountInfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
