// SPDX-License-Identifier: MIT

package preflight

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeHost is a Host whose sysctls are files under a temporary directory.
func fakeHost(t *testing.T, sysctls map[string]string) *Host {
	t.Helper()
	dir := t.TempDir()
	for k, v := range sysctls {
		p := filepath.Join(dir, strings.ReplaceAll(k, ".", "/"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &Host{
		ProcSys: dir, TUN: filepath.Join(dir, "tun"), UID: 1000, GID: 1000,
		NewUserNS: func() error { return nil },
		NOFILE:    func() (uint64, uint64, error) { return 1024, 524288, nil },
	}
}

func TestPingGroup(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want Status
	}{{"0 2147483647", OK}, {"1000 1000", OK}, {"1 0", Warn}, {"0 999", Warn}, {"garbage", Warn}} {
		if got := fakeHost(t, map[string]string{"net.ipv4.ping_group_range": tc.v}).PingGroup(); got.Status != tc.want {
			t.Errorf("ping_group_range %q: got %v (%s), want %v", tc.v, got.Status, got.Detail, tc.want)
		}
	}
}

func TestPortBlocks(t *testing.T) {
	h := fakeHost(t, map[string]string{"net.ipv4.ip_local_port_range": "32768\t60999"})
	for _, tc := range []struct {
		lo, hi uint16
		size   int
		want   Status
		detail string
	}{
		{0, 0, 256, OK, "110 blocks"},
		{40000, 50000, 256, OK, "39 blocks"},
		{1000, 2000, 64, Problem, "outside the local port range"},
		{40000, 41000, 256, Warn, "only 3 blocks"},
		{40000, 40100, 256, Problem, "no block"},
	} {
		got := h.PortBlocks(tc.lo, tc.hi, tc.size)
		if got.Status != tc.want || !strings.Contains(got.Detail, tc.detail) {
			t.Errorf("ports %d-%d/%d: got %v %q, want %v containing %q", tc.lo, tc.hi, tc.size, got.Status, got.Detail, tc.want, tc.detail)
		}
		if got.Status != OK && got.Fix == "" {
			t.Errorf("ports %d-%d/%d: %v without a fix", tc.lo, tc.hi, tc.size, got.Status)
		}
	}
}

func TestOpenFiles(t *testing.T) {
	for _, tc := range []struct {
		hard uint64
		want Status
	}{{100, Problem}, {8192, Warn}, {1 << 20, OK}} {
		h := fakeHost(t, nil)
		h.NOFILE = func() (uint64, uint64, error) { return 64, tc.hard, nil }
		if got := h.OpenFiles(4096, 65536, "test"); got.Status != tc.want {
			t.Errorf("hard %d: got %v, want %v", tc.hard, got.Status, tc.want)
		}
	}
}

func TestUserNamespaces(t *testing.T) {
	h := fakeHost(t, map[string]string{"kernel.unprivileged_userns_clone": "0"})
	if got := h.UserNamespaces(Problem, ""); got.Status != Problem || !strings.Contains(got.Fix, "unprivileged_userns_clone=1") {
		t.Errorf("unprivileged_userns_clone=0: got %+v", got)
	}
	h = fakeHost(t, map[string]string{"user.max_user_namespaces": "0"})
	if got := h.UserNamespaces(Warn, "; falls back"); got.Status != Warn || !strings.Contains(got.Detail, "falls back") {
		t.Errorf("max_user_namespaces=0: got %+v", got)
	}
	h = fakeHost(t, map[string]string{"kernel.apparmor_restrict_unprivileged_userns": "1"})
	h.NewUserNS = func() error { return errors.New("operation not permitted") }
	if got := h.UserNamespaces(Problem, ""); got.Status != Problem || !strings.Contains(got.Fix, "apparmor") {
		t.Errorf("AppArmor restriction: got %+v", got)
	}
	if got := fakeHost(t, nil).UserNamespaces(Problem, ""); got.Status != OK {
		t.Errorf("allowed: got %+v", got)
	}
}

func TestTUNDevice(t *testing.T) {
	h := fakeHost(t, nil)
	if got := h.TUNDevice(Problem, ""); got.Status != Problem || !strings.Contains(got.Detail, "missing") {
		t.Errorf("missing: got %+v", got)
	}
	if err := os.WriteFile(h.TUN, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if got := h.TUNDevice(Warn, ""); got.Status != Warn || !strings.Contains(got.Detail, "not a character device") {
		t.Errorf("regular file: got %+v", got)
	}
}

func TestReport(t *testing.T) {
	rep := Report{
		{Name: "a", Status: OK, Detail: "fine"},
		{Name: "b", Status: Warn, Detail: "meh\x1b[31m", Fix: "do x"},
	}
	if rep.Failed() {
		t.Error("Failed with no problem")
	}
	rep = append(rep, Result{Name: "c", Status: Problem, Detail: "broken", Fix: "do y"})
	if !rep.Failed() {
		t.Error("not Failed with a problem")
	}
	var b strings.Builder
	if err := rep.Write(&b); err != nil {
		t.Fatal(err)
	}
	want := "ok      a: fine\nwarn    b: meh [31m\n        fix: do x\nPROBLEM c: broken\n        fix: do y\n1 ok, 1 warnings, 1 problems\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(good, []byte("version = 1\n[policy]\ndefault = \"allow\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("version = 1\n[policy]\ndefualt = \"allow\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ConfigFile(good); len(got) != 1 || got[0].Status != OK {
		t.Errorf("good config: %+v", got)
	}
	if got := ConfigFile(bad); len(got) != 1 || got[0].Status != Problem || !strings.Contains(got[0].Detail, "bad.toml:3") {
		t.Errorf("bad config: %+v, want a problem naming bad.toml:3", got)
	}
	if got := ConfigFile(filepath.Join(dir, "missing.toml")); len(got) != 1 || got[0].Status != Problem {
		t.Errorf("missing config: %+v", got)
	}
	// A valid file with an entry that cannot take effect: a warning each.
	shadow := filepath.Join(dir, "shadow.toml")
	if err := os.WriteFile(shadow, []byte("version = 1\n[[policy.rule]]\nname = \"all\"\naction = \"deny\"\n[[policy.rule]]\nname = \"web\"\naction = \"deny\"\nports = [80]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ConfigFile(shadow); len(got) != 2 || got[0].Status != OK || got[1].Status != Warn || !strings.Contains(got[1].Name, "line 5, policy.rule[2]") || got[1].Fix == "" {
		t.Errorf("config with a shadowed rule: %+v, want ok and a warning naming line 5", got)
	}
}

func TestNestedUserNamespaces(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want Status
	}{{"15000", OK}, {"1", Warn}, {"2", Warn}, {"", OK}} {
		sc := map[string]string{}
		if tc.v != "" {
			sc["user.max_user_namespaces"] = tc.v
		}
		got := fakeHost(t, sc).NestedUserNamespaces()
		if got.Status != tc.want {
			t.Errorf("user.max_user_namespaces %q: got %v (%s), want %v", tc.v, got.Status, got.Detail, tc.want)
		}
		if got.Status == Warn && !strings.Contains(got.Fix, "max_user_namespaces") {
			t.Errorf("fix %q does not name the sysctl", got.Fix)
		}
	}
}

func TestFUSEDevice(t *testing.T) {
	h := fakeHost(t, nil)
	h.FUSE = filepath.Join(t.TempDir(), "fuse")
	if got := h.FUSEDevice(); got.Status != Warn || !strings.Contains(got.Detail, "missing") {
		t.Errorf("no device: got %v %q, want a warning that it is missing", got.Status, got.Detail)
	}
	// A regular file stands in for the device: what is checked is that
	// it opens read-write.
	if err := os.WriteFile(h.FUSE, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if got := h.FUSEDevice(); got.Status != OK {
		t.Errorf("openable: got %v %q, want ok", got.Status, got.Detail)
	}
	if os.Getuid() != 0 {
		os.Chmod(h.FUSE, 0o400)
		if got := h.FUSEDevice(); got.Status != Warn || !strings.Contains(got.Fix, "0666") {
			t.Errorf("not openable: got %v %q %q, want a warning with the fix", got.Status, got.Detail, got.Fix)
		}
	}
}

// TestControlOutside (issue 33, item 6): `gateway --check` warns when the
// control port is reachable on an outside address: listening on every
// interface, or on an address jobs' flows leave from.
func TestControlOutside(t *testing.T) {
	outside := []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")}
	for _, tc := range []struct {
		listen string
		want   Status
		says   string
	}{
		{"0.0.0.0:8443", Warn, "203.0.113.1"},
		{":8443", Warn, "every interface"},
		{"[::]:8443", Warn, "every interface"},
		{"203.0.113.1:8443", Warn, "outside address"},
		{"[2001:db8::1]:8443", Warn, "outside address"},
		{"10.0.0.1:8443", OK, "not an outside"},
		{"gw.inside:8443", OK, "host name"},
	} {
		r := ControlOutside(tc.listen, outside)
		if r.Status != tc.want || !strings.Contains(r.Detail, tc.says) || (tc.want == Warn && !strings.Contains(r.Fix, "INSIDE_ADDRESS:8443")) {
			t.Errorf("ControlOutside(%q) = %+v, want %v saying %q", tc.listen, r, tc.want, tc.says)
		}
	}
}
