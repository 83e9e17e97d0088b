// Package packaging holds the systemd unit, sysusers and tmpfiles snippets
// for the gateway, and tests that systemd's own tools accept them.
package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

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
	for _, want := range []string{"RestrictNamespaces=user net", "CapabilityBoundingSet=CAP_NET_ADMIN", "DeviceAllow=/dev/net/tun rw", "NoNewPrivileges=yes", "StateDirectoryMode=0700"} {
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
