// SPDX-License-Identifier: MIT

package topology

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestUserName is the unprivileged system user that clients and gateways
// run as in namespace tests.
const TestUserName = "airlocktest"

// User is a local user to run commands as.
type User struct {
	Name     string
	UID, GID int
}

// EnsureUser returns the test user, creating it as a system user without
// home directory or login shell if it does not exist. It is idempotent and
// safe under concurrency, also across test processes (it holds an flock
// while creating).
func EnsureUser(t testing.TB) *User {
	t.Helper()
	return EnsureNamedUser(t, TestUserName)
}

// NeighbourUserName is a second unprivileged system user, for tests of
// what another user of the node can do to a job.
const NeighbourUserName = "airlocktest2"

// EnsureNamedUser is EnsureUser for the system user name.
func EnsureNamedUser(t testing.TB, name string) *User {
	t.Helper()
	RequireRoot(t)
	if u, err := lookupNamedUser(name); err == nil {
		return u
	}
	f, err := os.OpenFile("/run/airlock-test-useradd.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("EnsureUser: %v", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("EnsureUser: flock: %v", err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if u, err := lookupNamedUser(name); err == nil {
		return u
	}
	out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	if err != nil {
		t.Fatalf("EnsureUser: useradd %s: %v: %s", name, err, out)
	}
	u, err := lookupNamedUser(name)
	if err != nil {
		t.Fatalf("EnsureUser: after useradd: %v", err)
	}
	return u
}

func lookupNamedUser(name string) (*User, error) {
	pw, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err := strconv.Atoi(pw.Uid)
	if err != nil {
		return nil, fmt.Errorf("uid %q: %w", pw.Uid, err)
	}
	gid, err := strconv.Atoi(pw.Gid)
	if err != nil {
		return nil, fmt.Errorf("gid %q: %w", pw.Gid, err)
	}
	return &User{Name: pw.Username, UID: uid, GID: gid}, nil
}

// Processes returns the PIDs of the live processes whose real uid is u's.
func (u *User) Processes() map[int]string {
	pids := map[int]string{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return pids
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if uid, ok := procUID(pid); !ok || uid != u.UID {
			continue
		}
		comm, _ := os.ReadFile("/proc/" + e.Name() + "/comm")
		netns, _ := os.Readlink("/proc/" + e.Name() + "/ns/net")
		pids[pid] = fmt.Sprintf("%s (%s)", string(trimNL(comm)), netns)
	}
	return pids
}

// procUID returns the real uid of pid from /proc/PID/status (as seen from
// the initial user namespace), which also covers non-dumpable processes.
func procUID(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
			uid, err := strconv.Atoi(f[1])
			return uid, err == nil
		}
	}
	return 0, false
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}
