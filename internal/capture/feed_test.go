// SPDX-License-Identifier: MIT

package capture

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestFeedTargetSafety checks where captured traffic may be written
// (issue 25, hole 7): an existing file or named pipe that another user
// owns, or that anyone may read or write, is refused (the gateway would
// hand jobs' traffic to whoever made it); an existing file is not
// truncated by an admin's `airlock capture -w`; a file or pipe of the
// gateway's own with a tight mode is used.
func TestFeedTargetSafety(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	other := 0
	if os.Geteuid() == 0 {
		other = 65534 // nobody
	}
	mk := func(name string, fifo bool, mode os.FileMode, uid int) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if fifo {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if uid != os.Geteuid() {
			if err := os.Chown(p, uid, -1); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	me := os.Geteuid()
	type tc struct {
		name  string
		path  string
		fifo  bool
		allow bool
	}
	cases := []tc{
		{"own file 0600", mk("own.pcap", false, 0o600, me), false, true},
		{"own file 0640", mk("group.pcap", false, 0o640, me), false, true},
		{"own file readable by anyone", mk("world.pcap", false, 0o644, me), false, false},
		{"own pipe 0600", mk("own.fifo", true, 0o600, me), true, true},
		{"own pipe writable by anyone", mk("world.fifo", true, 0o622, me), true, false},
	}
	if os.Geteuid() == 0 {
		cases = append(cases,
			tc{"another user's file", mk("foreign.pcap", false, 0o600, other), false, false},
			tc{"another user's pipe", mk("foreign.fifo", true, 0o600, other), true, false})
	}
	for _, c := range cases {
		var r *os.File
		if c.fifo {
			var err error
			// A reader, so that the open does not fail for want of one.
			if r, err = os.OpenFile(c.path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
				t.Fatal(err)
			}
		}
		f, _, err := openPath(c.path)
		if f != nil {
			f.Close()
		}
		if r != nil {
			r.Close()
		}
		if got := err == nil; got != c.allow {
			t.Errorf("%s: open as a feed: %v, want allowed %v", c.name, err, c.allow)
		}
		if !c.fifo && !c.allow {
			if b, _ := os.ReadFile(c.path); string(b) != "keep me" {
				t.Errorf("%s: refused, yet its content is now %q", c.name, b)
			}
		}
	}

	// airlock capture -w: a new file is made 0600; an existing one is
	// neither truncated nor written.
	existing := mk("admin.pcap", false, 0o600, me)
	if f, err := CreateFile(existing); err == nil {
		f.Close()
		t.Errorf("CreateFile of an existing file: allowed, want refused")
	} else if !strings.Contains(err.Error(), "exists") {
		t.Errorf("CreateFile of an existing file: %v, want an error saying it exists", err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Errorf("CreateFile truncated an existing file: now %q", b)
	}
	f, err := CreateFile(filepath.Join(dir, "new.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	f.Close()
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("CreateFile: mode %v, want 0600", fi.Mode().Perm())
	}
}
