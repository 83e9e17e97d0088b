// SPDX-License-Identifier: MIT

// Package packaging holds the systemd unit, sysusers and tmpfiles snippets
// for the gateway, and tests that systemd's own tools accept them.
package packaging

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

func TestMain(m *testing.M) { topology.Main(m) }

func need(t *testing.T, tool string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("%s not installed (part of systemd): %v", tool, err)
	}
	return p
}

// TestGatewayUnit runs systemd-analyze verify on the unit (with ExecStart
// pointing at a freshly built airlock, since verify checks that it is
// executable) and requires silence, then systemd-analyze security.
func TestGatewayUnit(t *testing.T) {
	analyze := need(t, "systemd-analyze")
	unit, err := os.ReadFile("airlock-gateway.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"RestrictNamespaces=user net", "DeviceAllow=/dev/net/tun rw", "NoNewPrivileges=yes", "StateDirectoryMode=0700"} {
		if !strings.Contains(string(unit), want+"\n") {
			t.Errorf("unit lacks %q", want)
		}
	}
	bin := topology.BuildAirlock(t)
	path := filepath.Join(t.TempDir(), "airlock-gateway.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), "/usr/bin/airlock", bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command(analyze, "security", "--offline=yes", path).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("systemd-analyze security --offline=yes: %v\n%s", err, out)
	}
	if v, _ := strconv.ParseFloat(string(m[1]), 64); v > 3.0 {
		t.Errorf("exposure level %s, want at most 3.0 (it was 2.4 when the unit was written)\n%s", m[1], out)
	}
	t.Logf("systemd-analyze security: exposure %s", m[1])
}

// TestSysusersTmpfiles applies the snippets to an empty root: the user
// appears and the state directory is its own, mode 0700.
func TestSysusersTmpfiles(t *testing.T) {
	sysusers, tmpfiles := need(t, "systemd-sysusers"), need(t, "systemd-tmpfiles")
	topology.RequireRoot(t)
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	abs := func(f string) string { p, _ := filepath.Abs(f); return p }
	if out, err := exec.Command(sysusers, "--root="+root, abs("airlock.sysusers.conf")).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	m := regexp.MustCompile(`(?m)^airlock:x:(\d+):(\d+):[^:]*:/var/lib/airlock:/usr/sbin/nologin$`).FindSubmatch(passwd)
	if m == nil {
		t.Fatalf("no airlock user in %s:\n%s", root, passwd)
	}
	if out, err := exec.Command(tmpfiles, "--root="+root, "--create", abs("airlock.tmpfiles.conf")).CombinedOutput(); err != nil {
		t.Fatalf("systemd-tmpfiles: %v\n%s", err, out)
	}
	fi, err := os.Stat(filepath.Join(root, "var", "lib", "airlock"))
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(string(m[1]))
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || int(st.Uid) != uid {
		t.Errorf("/var/lib/airlock: mode %v uid %d, want 0700 and the airlock user %d", fi.Mode().Perm(), st.Uid, uid)
	}
}

// TestNoHostCapabilities checks that the gateway needs no capability in
// its bounding set (issue 25, hole 10): a user namespace starts with a
// full bounding set of its own, so the gateway's private namespace gets
// CAP_NET_ADMIN there whatever the service's bounding set is. The unit
// therefore keeps none (CapabilityBoundingSet= empty), and the gateway,
// started as an unprivileged user with an empty bounding set in a fresh
// network namespace, still runs the kernel's TCP in its own namespace
// (--tcp-stack kernel makes a failure there a start-up error). The unit
// also gives feeds a runtime directory and bounds its tasks.
func TestNoHostCapabilities(t *testing.T) {
	unit, err := os.ReadFile("airlock-gateway.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CapabilityBoundingSet=\n", "RuntimeDirectory=airlock\n", "RuntimeDirectoryMode=0750\n", "TasksMax="} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("unit lacks %q", strings.TrimSpace(want))
		}
	}
	if strings.Contains(string(unit), "CAP_NET_ADMIN\n") {
		t.Errorf("unit keeps CAP_NET_ADMIN in a capability set")
	}

	topology.RequireRoot(t)
	need(t, "setpriv")
	need(t, "unshare")
	node := topology.NewTUNNode(t, topology.UserTUNMode)
	u := topology.EnsureUser(t)
	bin := topology.BuildAirlock(t)
	state := filepath.Join(topology.TempDir(t), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	argv := node.Command(nil, "unshare", "--net", "--", "sh", "-c",
		`ip link set lo up && exec setpriv --bounding-set -all --inh-caps -all --reuid "$1" --regid "$2" --clear-groups -- "$3" gateway --state "$4" --listen 127.0.0.1:0 --tcp-stack kernel`,
		"sh", strconv.Itoa(u.UID), strconv.Itoa(u.GID), bin, state)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	ready := false
	for !ready {
		select {
		case err := <-done:
			t.Fatalf("gateway with an empty bounding set exited: %v\n%s", err, out.String())
		case <-time.After(100 * time.Millisecond):
		}
		ready = strings.Contains(out.String(), "gateway ready")
		if ctx.Err() != nil {
			t.Fatalf("gateway with an empty bounding set not ready after 20 s:\n%s", out.String())
		}
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	<-done
	if !strings.Contains(out.String(), `tcp="kernel (IPv4)`) {
		t.Errorf("gateway with an empty bounding set does not terminate TCP in its namespace's kernel:\n%s", out.String())
	}
}
