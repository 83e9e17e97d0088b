// SPDX-License-Identifier: MIT

package packaging

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/test/topology"
)

// dist runs scripts/dist.sh into dir and returns its SHA256SUMS.
func dist(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command("../scripts/dist.sh")
	cmd.Env = append(os.Environ(), "DIST="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/dist.sh: %v\n%s", err, out)
	}
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	return string(sums)
}

// artefact returns the one file of dir matching glob.
func artefact(t *testing.T, dir, glob string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, glob))
	if len(m) != 1 {
		t.Fatalf("%s in %s: %v, want one file", glob, dir, m)
	}
	return m[0]
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %q: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// TestDist makes the release artefacts twice and requires the same bytes,
// checks the packages with Debian's and RPM's linters, and unpacks the
// tarball and runs its binary.
func TestDist(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git: the version comes from the checkout")
	}
	a, b := t.TempDir(), t.TempDir()
	sums := dist(t, a)
	if again := dist(t, b); again != sums {
		t.Errorf("make dist is not reproducible:\n%s\nthen\n%s", sums, again)
	}
	for _, glob := range []string{"airlock-*-linux-*.tar.gz", "airlock_*.deb", "airlock-*.rpm"} {
		if !regexp.MustCompile(`(?m)^[0-9a-f]{64}  ` + regexp.QuoteMeta(filepath.Base(artefact(t, a, glob))) + `$`).MatchString(sums) {
			t.Errorf("SHA256SUMS lacks %s:\n%s", glob, sums)
		}
	}
	c := exec.Command("sha256sum", "-c", "SHA256SUMS")
	c.Dir = a
	if out, err := c.CombinedOutput(); err != nil {
		t.Errorf("sha256sum -c: %v\n%s", err, out)
	}

	t.Run("Tarball", func(t *testing.T) {
		dir := t.TempDir()
		run(t, "tar", "-C", dir, "-xzf", artefact(t, a, "airlock-*-linux-*.tar.gz"))
		top, _ := filepath.Glob(filepath.Join(dir, "airlock-*"))
		if len(top) != 1 {
			t.Fatalf("tarball's top directory: %v", top)
		}
		for _, f := range []string{"bin/airlock", "lib/airlock/libairlock-preload.so", "lib/airlock/spank_airlock.so",
			"lib/airlock/airlock-condor-wrapper", "lib/systemd/system/airlock-gateway.service", "lib/sysusers.d/airlock.conf",
			"share/man/man1/airlock-run.1.gz", "share/man/man8/airlock-gateway.8.gz", "share/man/man5/airlock-gateway.toml.5.gz", "share/bash-completion/completions/airlock", "share/zsh/vendor-completions/_airlock",
			"share/fish/vendor_completions.d/airlock.fish", "share/doc/airlock/LICENSE", "share/doc/airlock/THIRD_PARTY_LICENSES",
			"share/airlock/slurm/spank_airlock.c", "share/airlock/sysctl/60-airlock-gateway.conf"} {
			if _, err := os.Stat(filepath.Join(top[0], f)); err != nil {
				t.Errorf("tarball lacks %s", f)
			}
		}
		out := run(t, filepath.Join(top[0], "bin/airlock"), "version")
		if !strings.Contains(out, "commit:") || strings.Contains(out, "version:  dev") {
			t.Errorf("the tarball's airlock version:\n%s", out)
		}
		// Static: no interpreter, no dynamic section.
		if out := run(t, "file", filepath.Join(top[0], "bin/airlock")); !strings.Contains(out, "statically linked") {
			t.Errorf("bin/airlock: %s", out)
		}
	})

	t.Run("Lintian", func(t *testing.T) {
		if _, err := exec.LookPath("lintian"); err != nil {
			t.Skip("lintian not installed")
		}
		out, err := exec.Command("lintian", "--tag-display-limit", "0", artefact(t, a, "airlock_*.deb")).CombinedOutput()
		var tags []string
		for _, l := range strings.Split(string(out), "\n") {
			if l != "" && !strings.Contains(l, "root privileges") {
				tags = append(tags, l)
			}
		}
		if err != nil || len(tags) > 0 {
			t.Errorf("lintian: %v\n%s", err, strings.Join(tags, "\n"))
		}
	})

	t.Run("RPM", func(t *testing.T) {
		if _, err := exec.LookPath("rpm"); err != nil {
			t.Skip("rpm not installed")
		}
		rpm := artefact(t, a, "airlock-*.rpm")
		info := run(t, "rpm", "-qip", rpm)
		for _, want := range []string{"Name        : airlock", "License     : MIT", "Summary     : Rootless VPN and egress gateway for batch jobs"} {
			if !strings.Contains(info, want) {
				t.Errorf("rpm -qip lacks %q:\n%s", want, info)
			}
		}
		files := run(t, "rpm", "-qlp", rpm)
		for _, want := range []string{"/usr/bin/airlock", "/usr/lib/systemd/system/airlock-gateway.service", "/usr/share/man/man1/airlock.1.gz", "/usr/share/man/man8/airlock-gateway.8.gz", "/usr/share/man/man5/airlock-gateway.toml.5.gz"} {
			if !strings.Contains(files, want+"\n") {
				t.Errorf("rpm -qlp lacks %s", want)
			}
		}
		if _, err := exec.LookPath("rpmlint"); err != nil {
			t.Skip("rpmlint not installed")
		}
		out, _ := exec.Command("rpmlint", "-c", "rpmlint.toml", rpm).CombinedOutput()
		if !strings.Contains(string(out), "0 errors, 0 warnings") {
			t.Errorf("rpmlint:\n%s", out)
		}
	})

	t.Run("InstallDeb", func(t *testing.T) { installDeb(t, artefact(t, a, "airlock_*.deb")) })
	t.Run("InstallRPM", func(t *testing.T) { installRPM(t, artefact(t, a, "airlock-*.rpm")) })
}

// installScript runs in a private mount namespace whose /usr, /etc and /var
// are overlays on the host's, so that dpkg really installs the package
// (files, its database, the postinst's user and directories) and nothing
// of it reaches the host, whatever the test's outcome. It writes what the
// test checks into $OUT.
const installScript = `set -eu
mount -t tmpfs tmpfs "$OVL"
for d in usr etc var; do
	mkdir -p "$OVL/$d.up" "$OVL/$d.work"
	mount -t overlay overlay -o "lowerdir=/$d,upperdir=$OVL/$d.up,workdir=$OVL/$d.work" "/$d"
done
rm -f /usr/bin/airlock # a copy someone installed by hand, in the overlay only
dpkg -i "$DEB" >"$OUT/dpkg-i" 2>&1
/usr/bin/airlock version --json >"$OUT/version.json"
/usr/bin/airlock help gateway >"$OUT/help"
if command -v man >/dev/null; then man -w airlock-run >"$OUT/man"; fi
getent passwd airlock >"$OUT/passwd"
stat -c %a /var/lib/airlock >"$OUT/statemode"
dpkg -L airlock >"$OUT/files"
dpkg-query -W -f='${Conffiles}\n' airlock >"$OUT/conffiles"
if [ -e /etc/apparmor.d/airlock ]; then echo installed; else echo absent; fi >"$OUT/apparmor"
dpkg --purge airlock >"$OUT/dpkg-purge" 2>&1
if [ -e /usr/bin/airlock ]; then echo present; else echo gone; fi >"$OUT/after-purge"
`

// installDeb installs the .deb with dpkg, runs its binary and purges it,
// in an overlay of the host's system directories (installScript).
func installDeb(t *testing.T, deb string) {
	topology.RequireRoot(t)
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("not a Debian system")
	}
	out, ovl := t.TempDir(), t.TempDir()
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", installScript)
	cmd.Env = append(os.Environ(), "DEB="+deb, "OUT="+out, "OVL="+ovl)
	if b, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(out, "dpkg-i"))
		t.Fatalf("install in an overlay: %v\n%s\ndpkg -i:\n%s", err, b, log)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Error(err)
		}
		return string(b)
	}
	var v struct{ Version, Commit string }
	inGit := exec.Command("git", "rev-parse", "--git-dir").Run() == nil
	if err := json.Unmarshal([]byte(read("version.json")), &v); err != nil || !strings.HasPrefix(v.Version, "v") || inGit && v.Commit == "" {
		t.Errorf("installed airlock version --json: %v %+v, want a version (and in a checkout a commit)", err, v)
	}
	if h := read("help"); !strings.Contains(h, "--state DIR") {
		t.Errorf("installed airlock help gateway:\n%s", h)
	}
	if _, err := exec.LookPath("man"); err == nil && !strings.Contains(read("man"), "/usr/share/man/man1/airlock-run.1.gz") {
		t.Errorf("man -w airlock-run: %q", read("man"))
	}
	// The postinst made the gateway's user and its private state dir.
	if p := read("passwd"); !strings.HasPrefix(p, "airlock:x:") || !strings.Contains(p, ":/var/lib/airlock:/usr/sbin/nologin") {
		t.Errorf("user airlock after install: %q", p)
	}
	if m := strings.TrimSpace(read("statemode")); m != "700" {
		t.Errorf("/var/lib/airlock after install: mode %s, want 700", m)
	}
	files := read("files")
	for _, want := range []string{"/usr/bin/airlock", "/usr/share/doc/airlock/copyright", "/usr/lib/airlock/libairlock-preload.so",
		"/usr/lib/systemd/system/airlock-gateway.service", "/usr/share/bash-completion/completions/airlock"} {
		if !strings.Contains(files, want+"\n") {
			t.Errorf("dpkg -L airlock lacks %s", want)
		}
	}
	if g := strings.TrimSpace(read("after-purge")); g != "gone" {
		t.Errorf("/usr/bin/airlock after dpkg --purge: %s", g)
	}
	// The gateway's settings are a conffile, kept on upgrades.
	if c := read("conffiles"); !strings.Contains(c, " /etc/default/airlock-gateway ") {
		t.Errorf("dpkg's conffiles of airlock: %q, want /etc/default/airlock-gateway", c)
	}
	// The AppArmor profile goes to /etc/apparmor.d where this host's
	// AppArmor parses it (AppArmor 4), and nowhere else (AppArmor 3 would
	// fail to load it at boot).
	want := "absent"
	if exec.Command("apparmor_parser", "-Q", "-K", "apparmor/airlock").Run() == nil {
		want = "installed"
	}
	if got := strings.TrimSpace(read("apparmor")); got != want {
		t.Errorf("/etc/apparmor.d/airlock after dpkg -i: %s, want %s (the host's apparmor_parser decides)", got, want)
	}
	// Nothing reached the host.
	if exec.Command("dpkg-query", "-W", "airlock").Run() == nil {
		t.Error("the host's dpkg database lists airlock after the test")
	}
}

// rpmInstallScript installs the .rpm with rpm --root into a scratch root:
// an overlay on the host's root file system (which gives the package's
// scripts a shell, systemd-sysusers and systemd-tmpfiles) in a private
// mount namespace, so that nothing reaches the host. rpm runs the
// package's scripts chrooted there. It writes what the test checks into
// $OUT.
const rpmInstallScript = `set -eu
mount -t tmpfs tmpfs "$OVL"
mkdir -p "$OVL/up" "$OVL/work" "$OVL/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$OVL/up,workdir=$OVL/work" "$OVL/root"
r=$OVL/root
mount -t proc proc "$r/proc"
mount -t tmpfs tmpfs "$r/run"
rm -f "$r/usr/bin/airlock"
mkdir -p "$r/var/lib/rpm"
rpm --root "$r" --initdb
rpm --root "$r" -i --nodeps "$RPM" >"$OUT/rpm-i" 2>&1
rpm --root "$r" -ql airlock >"$OUT/files"
chroot "$r" /usr/bin/airlock version >"$OUT/version"
chroot "$r" getent passwd airlock >"$OUT/passwd" || true
stat -c %a "$r/var/lib/airlock" >"$OUT/statemode"
cp "$r/etc/sysconfig/airlock-gateway" "$OUT/sysconfig"
systemd-analyze --root="$r" verify /usr/lib/systemd/system/airlock-gateway.service >"$OUT/verify" 2>&1 || echo "exit $?" >>"$OUT/verify"
rpm --root "$r" -e airlock >"$OUT/rpm-e" 2>&1
if [ -e "$r/usr/bin/airlock" ]; then echo present; else echo gone; fi >"$OUT/after-erase"
`

// installRPM installs the .rpm into a scratch root with its scripts run
// (rpmInstallScript), checks what they made, the unit with
// systemd-analyze verify, and the files' places for EL (the conffile in
// /etc/sysconfig naming itself, completion where EL's bash, zsh and fish
// look), then erases it.
func installRPM(t *testing.T, rpm string) {
	topology.RequireRoot(t)
	out, ovl := t.TempDir(), t.TempDir()
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", rpmInstallScript)
	cmd.Env = append(os.Environ(), "RPM="+rpm, "OUT="+out, "OVL="+ovl)
	if b, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(out, "rpm-i"))
		t.Fatalf("rpm --root in an overlay: %v\n%s\nrpm -i:\n%s", err, b, log)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Error(err)
		}
		return string(b)
	}
	if v := read("version"); !strings.Contains(v, "commit:") {
		t.Errorf("installed airlock version:\n%s", v)
	}
	// The %post made the gateway's user and its private state dir.
	if p := read("passwd"); !strings.HasPrefix(p, "airlock:x:") || !strings.Contains(p, ":/var/lib/airlock:") {
		t.Errorf("user airlock after rpm -i: %q\nrpm -i:\n%s", p, read("rpm-i"))
	}
	if m := strings.TrimSpace(read("statemode")); m != "700" {
		t.Errorf("/var/lib/airlock after rpm -i: mode %s, want 700", m)
	}
	if v := strings.TrimSpace(read("verify")); v != "" {
		t.Errorf("systemd-analyze verify of the installed unit:\n%s", v)
	}
	files := read("files")
	for _, want := range []string{"/usr/bin/airlock", "/etc/sysconfig/airlock-gateway", "/usr/lib/systemd/system/airlock-gateway.service",
		"/usr/share/bash-completion/completions/airlock", "/usr/share/zsh/site-functions/_airlock", "/usr/share/fish/vendor_completions.d/airlock.fish",
		"/usr/share/airlock/apparmor/airlock"} {
		if !strings.Contains(files, want+"\n") {
			t.Errorf("rpm -ql airlock lacks %s", want)
		}
	}
	for _, never := range []string{"/etc/default/", "/usr/share/zsh/vendor-completions/"} {
		if strings.Contains(files, never) {
			t.Errorf("rpm -ql airlock has Debian's %s", never)
		}
	}
	if c := read("sysconfig"); !strings.Contains(c, "--env-file /etc/sysconfig/airlock-gateway") || strings.Contains(c, "/etc/default/airlock-gateway") {
		t.Errorf("/etc/sysconfig/airlock-gateway names the wrong file:\n%s", c)
	}
	if g := strings.TrimSpace(read("after-erase")); g != "gone" {
		t.Errorf("/usr/bin/airlock after rpm -e: %s\n%s", g, read("rpm-e"))
	}
}
