// SPDX-License-Identifier: MIT

package fusemount

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountOptions is a parsed fusermount3 -o list: what goes into mount(2)'s
// flags, its data string (after fd, rootmode, user_id and group_id) and
// its source and type.
type mountOptions struct {
	flags   uintptr
	data    []string // kernel options: default_permissions, allow_other, max_read=N
	fsname  string
	subtype string
}

// flagOptions are the generic mount flags fusermount3 passes on; "suid"
// and "dev" are refused for a user, as fusermount3 does.
var flagOptions = map[string]struct {
	set   bool
	flags uintptr
}{
	"ro": {true, unix.MS_RDONLY}, "rw": {false, unix.MS_RDONLY},
	"noexec": {true, unix.MS_NOEXEC}, "exec": {false, unix.MS_NOEXEC},
	"nosuid": {true, unix.MS_NOSUID}, "nodev": {true, unix.MS_NODEV},
	"sync": {true, unix.MS_SYNCHRONOUS}, "async": {false, unix.MS_SYNCHRONOUS},
	"dirsync": {true, unix.MS_DIRSYNC},
	"noatime": {true, unix.MS_NOATIME}, "atime": {false, unix.MS_NOATIME},
	"nodiratime": {true, unix.MS_NODIRATIME}, "diratime": {false, unix.MS_NODIRATIME},
	"relatime": {true, unix.MS_RELATIME}, "norelatime": {false, unix.MS_RELATIME},
	"strictatime": {true, unix.MS_STRICTATIME}, "nostrictatime": {false, unix.MS_STRICTATIME},
}

// parseOptions parses a comma-separated -o list as fusermount3 does for a
// user who is not root of the node. userAllowOther is /etc/fuse.conf's
// user_allow_other.
func parseOptions(s string, userAllowOther bool) (mountOptions, error) {
	o := mountOptions{flags: unix.MS_NOSUID | unix.MS_NODEV}
	if s == "" {
		return o, nil
	}
	for _, opt := range splitOptions(s) {
		name, val, hasVal := strings.Cut(opt, "=")
		switch {
		case opt == "":
		case hasVal && name == "fsname":
			o.fsname = val
		case hasVal && name == "subtype":
			o.subtype = val
		case hasVal && name == "max_read":
			if _, err := strconv.ParseUint(val, 10, 32); err != nil {
				return o, fmt.Errorf("bad max_read %q", val)
			}
			o.data = append(o.data, opt)
		case opt == "default_permissions":
			o.data = append(o.data, opt)
		case opt == "allow_other" || opt == "allow_root":
			if !userAllowOther {
				return o, fmt.Errorf("option %s only allowed if 'user_allow_other' is set in /etc/fuse.conf", opt)
			}
			o.data = append(o.data, "allow_other")
		case opt == "suid" || opt == "dev":
			return o, fmt.Errorf("unsafe option %s ignored: a FUSE mount of a user is always nosuid,nodev", opt)
		case opt == "auto_unmount":
			return o, fmt.Errorf("option auto_unmount is not supported inside airlock run: unmount with fusermount3 -u (the job's mounts end with the job anyway)")
		case opt == "blkdev" || strings.HasPrefix(opt, "blksize="):
			return o, fmt.Errorf("option %s needs a block device: not for a user", opt)
		case opt == "nonempty" || opt == "user" || opt == "nouser" || opt == "auto" || opt == "noauto" || opt == "_netdev" || opt == "nofail":
			// fusermount3 ignores these (mount(8) and fstab words).
		default:
			f, ok := flagOptions[opt]
			if !ok {
				return o, fmt.Errorf("unknown option '%s'", opt)
			}
			if f.set {
				o.flags |= f.flags
			} else {
				o.flags &^= f.flags
			}
		}
	}
	o.flags |= unix.MS_NOSUID | unix.MS_NODEV
	return o, nil
}

// splitOptions splits at commas not escaped with a backslash, as
// fusermount3 does (a fsname may hold one).
func splitOptions(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ',':
			out = append(out, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(out, cur.String())
}

// fsType is the mount's type: fuse, or fuse.SUBTYPE.
func (o mountOptions) fsType() string {
	if o.subtype != "" {
		return "fuse." + o.subtype
	}
	return "fuse"
}

// source is the mount's source: fsname, else the given default.
func (o mountOptions) source(dflt string) string {
	if o.fsname != "" {
		return o.fsname
	}
	return dflt
}

// kernelData is mount(2)'s data string for the descriptor fd.
func (o mountOptions) kernelData(fd int, rootMode uint32, uid, gid int) string {
	d := fmt.Sprintf("fd=%d,rootmode=%o,user_id=%d,group_id=%d", fd, rootMode&unix.S_IFMT, uid, gid)
	for _, x := range o.data {
		d += "," + x
	}
	return d
}

// fuseConf is where fusermount3 reads user_allow_other.
const fuseConf = "/etc/fuse.conf"

// userAllowOther reports whether conf (fuse.conf's text) has a
// user_allow_other line.
func userAllowOther(conf []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(conf))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "user_allow_other" {
			return true
		}
	}
	return false
}

// allowedFSTypes are the file systems a user may mount over, as
// fusermount3 allows (by statfs magic): not /proc, /sys, cgroups or
// devices.
var allowedFSTypes = map[int64]string{
	0x61756673: "aufs", 0x9123683E: "btrfs", 0x00C36400: "ceph", 0xFF534D42: "cifs",
	0x0000F15F: "ecryptfs", 0x0000EF53: "ext4", 0x65735546: "fuse", 0x47504653: "gpfs",
	0x0BD00BD0: "lustre", 0x00006969: "nfs", 0x7461636f: "ocfs2", 0x794C7630: "overlayfs",
	0x858458F6: "ramfs", 0x73717368: "squashfs", 0x01021994: "tmpfs", 0x58465342: "xfs",
	0x2FC12FC1: "zfs", 0x5346414F: "afs", 0x6B414653: "afs",
	0x4244: "hfs", 0x482b: "hfsplus", 0x5346544e: "ntfs", 0x4d44: "vfat", 0x2011BAB0: "exfat",
	0x52654973: "reiserfs", 0x3153464a: "jfs", 0x24051905: "ubifs", 0x15013346: "udf",
	0x9660: "isofs", 0xF2F52010: "f2fs", 0x013111A8: "ibrix", 0x19830326: "fhgfs/beegfs",
}
