// SPDX-License-Identifier: MIT

// Package mungetest runs a real munged (from the distribution's munge
// package) for tests: its own key, socket, seed, PID and log files in a
// temporary directory, in the foreground, killed by PID at cleanup.
package mungetest

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Options configure Start.
type Options struct {
	// Key is the MUNGE key; nil makes a random one.
	Key []byte
	// Origin is munged --origin (an address, host name or interface);
	// empty leaves munged's own choice.
	Origin string
	// Wrap, if set, returns the argv that runs argv (munged's) where the
	// test wants it, e.g. in a network namespace. The socket path is on
	// the host's file system either way.
	Wrap func(argv []string) []string
	// Socket is the socket's path; empty puts it in the daemon's
	// temporary directory.
	Socket string
}

// Daemon is a running munged.
type Daemon struct {
	// Socket is its socket; Dir the directory that holds its files; Key
	// its key file.
	Socket, Dir, Key string
	cmd              *exec.Cmd
}

// Munged returns the path of munged, failing t in CI (where
// scripts/setup.sh installs it) and skipping it elsewhere if it is
// missing.
func Munged(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("munged")
	if err != nil {
		p = "/usr/sbin/munged"
		if _, serr := os.Stat(p); serr != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("munged not installed (scripts/setup.sh installs the munge package): %v", err)
			}
			t.Skipf("munged not installed: %v", err)
		}
	}
	return p
}

// NewKey returns a random 1024-byte MUNGE key.
func NewKey(t testing.TB) []byte {
	t.Helper()
	k := make([]byte, 1024)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// Start runs munged with o and waits until its socket exists.
func Start(t testing.TB, o Options) *Daemon {
	t.Helper()
	bin := Munged(t)
	dir, err := os.MkdirTemp("", "airlock-munge-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// munged wants its socket's directory to be reachable by everyone
	// (clients of any uid) and its key file private.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	key := o.Key
	if key == nil {
		key = NewKey(t)
	}
	d := &Daemon{Dir: dir, Socket: filepath.Join(dir, "munge.socket"), Key: filepath.Join(dir, "munge.key")}
	if o.Socket != "" {
		d.Socket = o.Socket
	}
	if err := os.WriteFile(d.Key, key, 0o400); err != nil {
		t.Fatal(err)
	}
	argv := []string{bin, "--foreground", "--force", "--key-file=" + d.Key, "--socket=" + d.Socket,
		"--pid-file=" + filepath.Join(dir, "munged.pid"), "--seed-file=" + filepath.Join(dir, "seed"),
		"--log-file=" + filepath.Join(dir, "munged.log"), "--num-threads=2"}
	if o.Origin != "" {
		argv = append(argv, "--origin="+o.Origin)
	}
	if o.Wrap != nil {
		argv = o.Wrap(argv)
	}
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	d.cmd.Stdout, d.cmd.Stderr = &out, &out
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start munged: %v", err)
	}
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if fi, err := os.Stat(d.Socket); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return d
		}
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(dir, "munged.log"))
			t.Fatalf("munged exited: %s\n%s", out.String(), log)
		case <-ctx.Done():
			t.Fatalf("munged: no socket after 10 s: %s", out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Log returns munged's log, for failure messages.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(filepath.Join(d.Dir, "munged.log"))
	return fmt.Sprintf("--- munged log ---\n%s", b)
}

// DefaultSocket is MUNGE's default socket, where clients that name none
// look.
const DefaultSocket = "/run/munge/munge.socket.2"

// StartDecoy makes sure that a munged answers on MUNGE's default socket
// with a key of its own, as on every real node where the cluster's munged
// runs beside the dedicated node+gateway one: a test whose jobs make a
// credential there by mistake then fails (the gateway cannot decode it)
// rather than passing on a machine without munged. A munged already
// there (the machine's own, or another test's) is left as it is; one
// started here is stopped at cleanup. It needs root, and skips t without.
func StartDecoy(t testing.TB) {
	t.Helper()
	if c, err := net.DialTimeout("unix", DefaultSocket, time.Second); err == nil {
		c.Close()
		return
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run a munged on MUNGE's default socket")
	}
	if err := os.MkdirAll(filepath.Dir(DefaultSocket), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(DefaultSocket) // a stale socket that nobody answers on
	os.Remove(DefaultSocket + ".lock")
	d := Start(t, Options{Socket: DefaultSocket})
	t.Cleanup(func() {
		// munged leaves its socket and lock file; a socket nobody
		// answers on must not stay at the default path.
		os.Remove(d.Socket)
		os.Remove(d.Socket + ".lock")
	})
}
