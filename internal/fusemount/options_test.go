// SPDX-License-Identifier: MIT

package fusemount

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		opts       string
		allowOther bool
		flags      uintptr // beyond nosuid,nodev
		data, typ  string
		source     string
		err        string
	}{
		{opts: "", typ: "fuse", source: "/dev/fuse"},
		{opts: "ro,subtype=squashfuse,fsname=/img\\,x.sqfs", flags: unix.MS_RDONLY, typ: "fuse.squashfuse", source: "/img,x.sqfs"},
		{opts: "rw,default_permissions,max_read=131072", data: ",default_permissions,max_read=131072", typ: "fuse", source: "/dev/fuse"},
		{opts: "noexec,exec,noatime", flags: unix.MS_NOATIME, typ: "fuse", source: "/dev/fuse"},
		{opts: "nonempty,_netdev", typ: "fuse", source: "/dev/fuse"},
		{opts: "allow_other", allowOther: true, data: ",allow_other", typ: "fuse", source: "/dev/fuse"},
		{opts: "allow_other", err: "user_allow_other"},
		{opts: "allow_root", err: "user_allow_other"},
		{opts: "suid", err: "unsafe option suid"},
		{opts: "dev", err: "unsafe option dev"},
		{opts: "blkdev", err: "block device"},
		{opts: "auto_unmount", err: "auto_unmount"},
		{opts: "max_read=x", err: "bad max_read"},
		{opts: "user_id=0", err: "unknown option"},
		{opts: "fd=3", err: "unknown option"},
		{opts: "rootmode=40000", err: "unknown option"},
	} {
		o, err := parseOptions(tc.opts, tc.allowOther)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: got err %v, want one with %q", tc.opts, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.opts, err)
			continue
		}
		if want := tc.flags | unix.MS_NOSUID | unix.MS_NODEV; o.flags != want {
			t.Errorf("%q: flags got %#x, want %#x", tc.opts, o.flags, want)
		}
		if got, want := o.kernelData(7, unix.S_IFDIR|0o755, 1000, 100), "fd=7,rootmode=40000,user_id=1000,group_id=100"+tc.data; got != want {
			t.Errorf("%q: data got %q, want %q", tc.opts, got, want)
		}
		if o.fsType() != tc.typ || o.source("/dev/fuse") != tc.source {
			t.Errorf("%q: got type %q source %q, want %q %q", tc.opts, o.fsType(), o.source("/dev/fuse"), tc.typ, tc.source)
		}
	}
}

func TestUserAllowOther(t *testing.T) {
	for conf, want := range map[string]bool{
		"":                                   false,
		"# user_allow_other\n":               false,
		"mount_max = 1000\nuser_allow_other": true,
		"  user_allow_other  \n":             true,
	} {
		if got := userAllowOther([]byte(conf)); got != want {
			t.Errorf("%q: got %v, want %v", conf, got, want)
		}
	}
}

func TestUnescapeMountInfo(t *testing.T) {
	if got := unescapeMountInfo(`/tmp/a\040b\134c`); got != `/tmp/a b\c` {
		t.Errorf("got %q", got)
	}
}

func TestShimUsage(t *testing.T) {
	var out, errb strings.Builder
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing mountpoint"},
		{[]string{"-z", "/x"}, "-z can only be used with -u"},
		{[]string{"--auto-unmount", "/x"}, "not supported"},
		{[]string{"-x", "/x"}, "unknown option"},
		{[]string{"/x", "/y"}, "extra argument"},
		{[]string{"-o", "ro", "--", t.TempDir()}, "old style mounting not supported"},
	} {
		errb.Reset()
		if code := shim("fusermount3", tc.args, "", &out, &errb); code == 0 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: exit %d, %q, want %q", tc.args, code, errb.String(), tc.want)
		}
	}
}
