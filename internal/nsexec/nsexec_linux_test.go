// SPDX-License-Identifier: MIT

package nsexec

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestJobUnprivileged runs jobs as an unprivileged user, the way airlock
// runs on a compute node.
func TestJobUnprivileged(t *testing.T) {
	uid := topology.EnsureUser(t).UID
	bin := helperBinary(t)

	t.Run("namespace", func(t *testing.T) {
		res := runHelper(t, bin, 0o666, helperSpec{
			Args: []string{"sh", "-c", `id -u; ip -o addr show dev tun0; ip -o link show dev tun0; ip -o link show dev lo; ip route;
				cat /proc/net/dev; cat /etc/resolv.conf; grep CapEff /proc/self/status;
				ls -l /proc/$$/fd; echo fds:; ls -1 /proc/$$/fd; echo :fds; env`},
			DNS: []string{"100.64.0.1"},
		})
		if res.StartErr != "" || res.Status != 0 {
			t.Fatalf("start error %q, status %d, stderr %q", res.StartErr, res.Status, res.Stderr)
		}
		t.Logf("job output:\n%s", res.Stdout)
		if res.UID != uid {
			t.Errorf("helper uid: got %d, want %d", res.UID, uid)
		}
		if got, _, _ := strings.Cut(res.Stdout, "\n"); got != strconv.Itoa(uid) {
			t.Errorf("id -u in job: got %q, want %d", got, uid)
		}
		for _, want := range []string{
			"inet 100.64.0.2/16",
			"mtu 1380",
			"default via 100.64.0.1 dev tun0",
			"tun0:", // /proc/net/dev
			"nameserver 100.64.0.1\n",
			"CapEff:\t0000000000000000",
		} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("job output lacks %q:\n%s", want, res.Stdout)
			}
		}
		if !strings.Contains(res.Stdout, "lo: <LOOPBACK,UP") {
			t.Errorf("lo not up:\n%s", res.Stdout)
		}
		_, fds, _ := strings.Cut(res.Stdout, "fds:\n")
		fds, _, _ = strings.Cut(fds, ":fds")
		if got := strings.Join(strings.Fields(fds), ","); got != "0,1,2" {
			t.Errorf("job's open fds: got %s, want 0,1,2", got)
		}
		for _, bad := range []string{"/dev/net/tun", envPrefix} {
			if strings.Contains(res.Stdout, bad) {
				t.Errorf("job inherited %q:\n%s", bad, res.Stdout)
			}
		}
		if res.TUNName != "tun0" {
			t.Errorf("TUNGETIFF name: got %q, want %q", res.TUNName, "tun0")
		}
		if want := uint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR); res.TUNFlags&want != want {
			t.Errorf("TUNGETIFF flags: got %#x, want %#x set", res.TUNFlags, want)
		}
	})

	for _, tc := range []struct {
		name   string
		spec   helperSpec
		want   int
		stderr string
	}{
		{"exit-0", helperSpec{Args: []string{"true"}}, 0, ""},
		{"exit-3", helperSpec{Args: []string{"sh", "-c", "exit 3"}}, 3, ""},
		{"sigkill-137", helperSpec{Args: []string{"sh", "-c", "kill -9 $$"}}, 137, ""},
		{"sigterm-42", helperSpec{
			Args:         []string{"sh", "-c", `trap "exit 42" TERM; echo ready; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; exit 1`},
			SignalOnLine: "ready",
		}, 42, ""},
		{"not-found-127", helperSpec{Args: []string{"airlock-no-such-command"}}, 127,
			`airlock: exec "airlock-no-such-command": executable file not found in $PATH`},
		{"not-executable-126", helperSpec{Args: []string{"/etc/passwd"}}, 126, `airlock: exec "/etc/passwd": permission denied`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runHelper(t, bin, 0o666, tc.spec)
			if res.StartErr != "" || res.WaitErr != "" {
				t.Fatalf("start error %q, wait error %q", res.StartErr, res.WaitErr)
			}
			if res.Status != tc.want {
				t.Errorf("status: got %d, want %d (stderr %q)", res.Status, tc.want, res.Stderr)
			}
			if tc.stderr != "" && !strings.Contains(res.Stderr, tc.stderr) {
				t.Errorf("stderr: got %q, want %q", res.Stderr, tc.stderr)
			}
		})
	}

	t.Run("cleanup-background", func(t *testing.T) {
		res := runHelper(t, bin, 0o666, helperSpec{
			Args:          []string{"sh", "-c", "sleep 30 >/dev/null 2>&1 </dev/null & echo $!; exit 0"},
			BackgroundPID: true,
		})
		if res.BackgroundPID > 0 {
			t.Cleanup(func() { unix.Kill(res.BackgroundPID, unix.SIGKILL) })
		}
		if res.Status != 0 || res.BackgroundPID <= 0 {
			t.Fatalf("status %d, background pid %d, stdout %q", res.Status, res.BackgroundPID, res.Stdout)
		}
		if !res.BgAliveBefore {
			t.Errorf("background process %d was not running before Cleanup", res.BackgroundPID)
		}
		if !res.BgGoneAfter {
			t.Errorf("background process %d survived Cleanup", res.BackgroundPID)
		}
	})

	t.Run("pdeathsig", func(t *testing.T) {
		// The job dies with airlock: SIGKILL to the helper (which cannot
		// forward anything) kills the job through its parent-death
		// signal. The namespace child's Go code may exec the job from
		// any of its threads, and an execve from a thread other than the
		// first drops the signal (3 runs in 100 on a loaded machine
		// before reexec.Child.Exec); hence several runs.
		for i := 0; i < 5; i++ {
			orphanDies(t, bin)
		}
	})
}

// orphanDies starts a helper that runs sleep as its job, kills the helper
// with SIGKILL and fails t unless the job is gone once the helper is. The
// signal goes out when the dying helper reaches exit_notify, after it has
// closed its files (the job's TUN among them, which can wait for
// rtnl_lock), so the bound counts from the helper's death, not from the
// SIGKILL.
func orphanDies(t *testing.T, bin string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := helperCmd(ctx, t, bin, 0o666, helperSpec{Mode: "orphan", Args: []string{"sleep", "30"}})
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	defer func() { <-reaped }()
	defer cmd.Process.Kill()
	jobPID := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), pidMarker); ok {
			jobPID, _ = strconv.Atoi(p)
			break
		}
	}
	go func() { cmd.Wait(); close(reaped) }()
	if jobPID <= 0 {
		t.Fatal("helper did not report the job's pid")
	}
	defer unix.Kill(jobPID, unix.SIGKILL)
	if !waitExe(jobPID, "sleep", 5*time.Second) {
		t.Fatalf("job %d did not exec sleep", jobPID)
	}
	// unshare, sh and setpriv exec the test binary, so the helper is
	// cmd's process.
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reaped:
	case <-time.After(60 * time.Second):
		t.Fatalf("helper not reaped 60 s after SIGKILL")
	}
	dead := time.Since(killed)
	if !waitGone(jobPID, 5*time.Second) {
		t.Errorf("job %d alive 5 s after its parent died (%v after the SIGKILL)", jobPID, dead)
	}
}

// waitExe waits until /proc/PID/comm is comm.
func waitExe(pid int, comm string, d time.Duration) bool {
	return topology.Poll(d, func() bool {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		return strings.TrimSpace(string(b)) == comm
	})
}

// TestTUNNotAccessible checks both Preflight and Start as an unprivileged
// user when /dev/net/tun is 0600.
func TestTUNNotAccessible(t *testing.T) {
	bin := helperBinary(t)

	res := runHelper(t, bin, 0o600, helperSpec{Mode: "preflight"})
	t.Logf("Preflight: %s", res.PreflightErr)
	for _, want := range []string{"/dev/net/tun", "mode 0600", "0666", "`chmod 0666 /dev/net/tun`", "CAP_NET_ADMIN"} {
		if !strings.Contains(res.PreflightErr, want) {
			t.Errorf("Preflight error %q lacks %q", res.PreflightErr, want)
		}
	}
	res = runHelper(t, bin, 0o600, helperSpec{Args: []string{"true"}})
	t.Logf("Start: %s", res.StartErr)
	for _, want := range []string{"create tun in job namespace: open /dev/net/tun: permission denied", "mode 0600", "chmod 0666 /dev/net/tun"} {
		if !strings.Contains(res.StartErr, want) {
			t.Errorf("Start error %q lacks %q", res.StartErr, want)
		}
	}
}

// TestJobAsRoot runs a job from the test process itself, as root.
func TestJobAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("tests must run as root (they create a user and a TUN device node)")
	}
	if err := Preflight(); err != nil {
		t.Fatalf("Preflight as root: %v", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j, err := Start(ctx, Config{
		Args:     []string{"sh", "-c", "id -u; ip -o link show dev tun9; ip -6 route show default"},
		Stdout:   outW,
		TUNName:  "tun9",
		Addrs:    []netip.Prefix{netip.MustParsePrefix("fd00::2/64")},
		Gateways: []netip.Addr{netip.MustParseAddr("fd00::1")},
	})
	outW.Close()
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer j.Cleanup()
	defer j.TUN().Close()
	if err := j.Run(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := j.Run(); err == nil {
		t.Errorf("second Run: got nil error, want one")
	}
	status, err := j.Wait()
	if status != 0 || err != nil {
		t.Fatalf("Wait: got %d, %v, want 0, nil", status, err)
	}
	b, _ := io.ReadAll(outR)
	for _, want := range []string{"0\n", "tun9: <POINTOPOINT", "mtu " + strconv.Itoa(DefaultMTU), "default via fd00::1 dev tun9"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("job output lacks %q:\n%s", want, b)
		}
	}
	j.Cleanup()
	j.Cleanup() // idempotent
	if err := j.Signal(syscall.SIGTERM); err == nil {
		t.Errorf("Signal after Cleanup: got nil error, want one")
	}
}

// TestCleanupBeforeRun checks that a job never run is torn down.
func TestCleanupBeforeRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j, err := Start(ctx, Config{Args: []string{"true"}, Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	pid := j.Pid()
	j.TUN().Close()
	j.Cleanup()
	if !waitGone(pid, 5*time.Second) {
		t.Errorf("namespace child %d survived Cleanup", pid)
	}
	if status, _ := j.Wait(); status != 137 && status != 1 {
		t.Errorf("status: got %d, want 137 or 1", status)
	}
}

// TestPrepareThenSetup checks a child started before its settings are
// known (airlock run starts it while it joins): until Setup it holds only
// Prepare's environment (the one other processes of the user can read),
// and the job gets Setup's environment, PATH included for its lookup,
// and Setup's network settings.
func TestPrepareThenSetup(t *testing.T) {
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	j, err := Prepare(Config{Args: []string{"sh", "-c", "echo A=$A; ip -o addr show dev tun0"},
		Env: []string{"A=early", "PATH=/nonexistent"}, Stdout: outW})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	defer j.Cleanup()
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(j.Pid()) + "/environ")
	if err != nil {
		t.Fatalf("read waiting child's environment: %v", err)
	}
	if strings.Contains(string(environ), "late") || !strings.Contains(string(environ), "A=early") {
		t.Errorf("waiting child's environment: got %q, want Prepare's (A=early)", environ)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = j.Setup(ctx, Config{Args: []string{"sh"}, Env: []string{"A=late", "PATH=/usr/bin:/bin"},
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}})
	outW.Close()
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	defer j.TUN().Close()
	if err := j.Setup(ctx, Config{Args: []string{"sh"}, Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}}); err == nil {
		t.Errorf("second Setup: got nil error, want one")
	}
	if err := j.Run(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if status, err := j.Wait(); status != 0 || err != nil {
		t.Fatalf("Wait: got %d, %v, want 0, nil", status, err)
	}
	b, _ := io.ReadAll(outR)
	for _, want := range []string{"A=late\n", "inet 10.9.0.2/24"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("job output lacks %q:\n%s", want, b)
		}
	}
}

// TestCleanupBeforeSetup checks that a child still waiting for its
// settings (the join failed) is torn down.
func TestCleanupBeforeSetup(t *testing.T) {
	j, err := Prepare(Config{Args: []string{"true"}})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	pid := j.Pid()
	j.Cleanup()
	if !waitGone(pid, 5*time.Second) {
		t.Errorf("namespace child %d survived Cleanup", pid)
	}
	if status, _ := j.Wait(); status != 137 && status != 1 {
		t.Errorf("status: got %d, want 137 or 1", status)
	}
}

// TestBindResolvConf checks the bind over a regular file, a symlink and a
// dangling symlink, in a private mount namespace.
func TestBindResolvConf(t *testing.T) {
	bin := helperBinary(t)
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "regular"), []byte("old\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "target"), []byte("target\n"), 0o644))
	must(os.Symlink("target", filepath.Join(dir, "link-to-existing")))
	must(os.Symlink("missing/stub-resolv.conf", filepath.Join(dir, "link-dangling")))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := helperCmd(ctx, t, bin, 0, helperSpec{Mode: "bind", Dir: dir})
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	res := parseResult(t, out)
	want := "# generated by airlock for this job\nnameserver 192.0.2.53\n"
	for _, name := range []string{"regular", "link-to-existing", "link-dangling"} {
		if got := res.Bind[name]; got != want {
			t.Errorf("%s after bind: got %q, want %q", name, got, want)
		}
	}
	if got := res.Bind["target"]; got != "target\n" {
		t.Errorf("symlink target after bind: got %q, want it untouched", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "regular")); string(b) != "old\n" {
		t.Errorf("host view of regular file changed: %q", b)
	}
}

func parseResult(t *testing.T, out []byte) helperResult {
	t.Helper()
	i := strings.LastIndex(string(out), resultMarker)
	if i < 0 {
		t.Fatalf("no result in helper output:\n%s", out)
	}
	line, _, _ := strings.Cut(string(out[i+len(resultMarker):]), "\n")
	var res helperResult
	if err := jsonUnmarshal(line, &res); err != nil {
		t.Fatalf("decode helper result %q: %v", line, err)
	}
	return res
}

// TestStartCanceled checks that a canceled Start leaves no child behind.
func TestStartCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	j, err := Start(ctx, Config{Args: []string{"true"}, Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}})
	if err == nil {
		j.TUN().Close()
		j.Cleanup()
		t.Fatal("Start with a canceled context: got nil error")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

// BenchmarkKillNetnsNone is the scan at every job's exit when the job
// left nothing behind: one pass over /proc that finds no process in the
// (here: an unused) namespace.
func BenchmarkKillNetnsNone(b *testing.B) {
	ns := unix.Stat_t{Dev: 1, Ino: 1}
	for b.Loop() {
		if n := killNetns(ns, nil); n != 0 {
			b.Fatalf("signalled %d", n)
		}
	}
}
