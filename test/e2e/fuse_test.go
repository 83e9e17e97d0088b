// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// squashfsImage makes a squashfs image holding hello.txt (content) and a
// directory the test user owns to mount it on; both readable by that
// user.
func squashfsImage(t *testing.T, u *topology.User, content string) (image, dir string) {
	t.Helper()
	for _, bin := range []string{"mksquashfs", "squashfuse"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not installed: run scripts/setup.sh", bin)
			}
			t.Skipf("%s not installed: run scripts/setup.sh", bin)
		}
	}
	base := topology.TempDir(t)
	src := filepath.Join(base, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "hello.txt"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	image = filepath.Join(base, "image.sqfs")
	if out, err := exec.Command("mksquashfs", src, image, "-quiet", "-noappend").CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v: %s", err, out)
	}
	if err := os.Chmod(image, 0o644); err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(base, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	return image, dir
}

// TestFUSE mounts a squashfs image with squashfuse inside airlock run, as
// a job does on the bare node: through fusermount3 (airlock's stand-in,
// which asks the job's mount server), and through a nested user
// namespace (unshare -Urm); the job reads the image and downloads through
// the tunnel in the same run. fusermount3's checks hold: a mount point
// the user may not write is refused, the mount is nosuid,nodev, allow_other
// needs user_allow_other, /proc is no mount point.
func TestFUSE(t *testing.T) {
	e := newEnvTopo(t, modeUser, []topology.Option{topology.WithUserFUSE()})
	const content = "hello from squashfs\n"
	image, dir := squashfsImage(t, e.u, content)
	url := fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)

	t.Run("Squashfuse", func(t *testing.T) {
		script := fmt.Sprintf(`set -e
squashfuse %[1]s %[2]s
cat %[2]s/hello.txt
grep " %[2]s fuse.squashfuse " /proc/self/mounts | grep -q nosuid,nodev && echo mounted
fusermount3 -u %[2]s
test ! -e %[2]s/hello.txt && echo unmounted
curl -sS --max-time 30 %[3]s | sha256sum`, image, dir, url)
		code, out, stderr := e.runWith(t, runOpts{}, "sh", "-c", script)
		want := content + "mounted\nunmounted\n" + e.sha["small"]
		if code != 0 || !strings.HasPrefix(out, want) {
			t.Fatalf("squashfuse in the job: exit %d, stdout %q, want %q%s", code, out, want, e.diag(stderr))
		}
	})

	t.Run("Nested", func(t *testing.T) {
		script := fmt.Sprintf(`squashfuse %[1]s %[2]s && cat %[2]s/hello.txt`, image, dir)
		code, out, stderr := e.runWith(t, runOpts{}, "unshare", "-Urm", "sh", "-c", script)
		if code != 0 || out != content {
			t.Fatalf("squashfuse in unshare -Urm in the job: exit %d, stdout %q%s", code, out, e.diag(stderr))
		}
	})

	// The fallback modes keep the node's namespaces: the node's setuid
	// fusermount3 works in preload and proxy modes, not under seccomp's
	// no_new_privs, as their mode lines say.
	t.Run("FallbackModes", func(t *testing.T) {
		topology.BuildPreload(t) // next to the airlock binary, where airlock run finds it
		modeLine := func(stderr string) string {
			for _, l := range strings.Split(stderr, "\n") {
				if strings.HasPrefix(l, "airlock: mode ") {
					return l
				}
			}
			return ""
		}
		script := fmt.Sprintf(`squashfuse %[1]s %[2]s && cat %[2]s/hello.txt && fusermount3 -u %[2]s`, image, dir)
		for _, mode := range []string{"preload", "proxy", "seccomp"} {
			code, out, stderr := e.runWith(t, runOpts{flags: []string{"--mode", mode}}, "sh", "-c", script)
			line := modeLine(stderr)
			switch mode {
			case "seccomp":
				if code == 0 || !strings.Contains(stderr, "Operation not permitted") || !strings.Contains(line, "fusermount3 fail") {
					t.Errorf("seccomp: exit %d, %q, mode line %q: want the mount refused, as the mode line says%s", code, out, line, e.diag(stderr))
				}
			default:
				if code != 0 || out != content || !strings.Contains(line, "FUSE mounts (fusermount3) as on the node") {
					t.Errorf("%s: exit %d, %q, mode line %q: want the node's fusermount3 to work, as the mode line says%s", mode, code, out, line, e.diag(stderr))
				}
			}
		}
	})

	// The mount server listens in the job's network namespace only: a
	// process of the same user outside the job (here on the node, while
	// a job with its server runs) cannot reach it.
	t.Run("ServerOnlyForTheJob", func(t *testing.T) {
		job := e.startWith(t, runOpts{}, "sleep", "20")
		defer job.Kill()
		time.Sleep(2 * time.Second)
		link := filepath.Join(filepath.Dir(dir), "fusermount3")
		if err := os.Symlink(e.airlock, link); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := e.tp.Run(t, 20*time.Second, e.tp.CN, e.u, link, "-u", dir)
		if code == 0 || !strings.Contains(stderr, "server is not reachable") {
			t.Errorf("the shim outside the job: exit %d, %q, %q; want the server unreachable", code, out, stderr)
		}
	})

	t.Run("Refusals", func(t *testing.T) {
		rootDir := filepath.Join(filepath.Dir(dir), "rootonly")
		if err := os.Mkdir(rootDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ name, cmd, want string }{
			{"not writable", fmt.Sprintf("squashfuse %s %s", image, rootDir), "no write access to mountpoint"},
			{"allow_other", fmt.Sprintf("squashfuse -o allow_other %s %s", image, dir), "user_allow_other"},
			{"proc", fmt.Sprintf("squashfuse %s /proc/self/fd", image), "forbidden"},
			// The job's own mounts that are not FUSE (airlock's
			// resolv.conf) are not the server's to unmount.
			{"not fuse", "fusermount3 -u /etc/resolv.conf", "is not a "},
			{"not mounted", "fusermount3 -u " + dir, "is not a mount point"},
		} {
			code, out, stderr := e.runWith(t, runOpts{}, "sh", "-c", tc.cmd)
			if code == 0 || !strings.Contains(stderr, tc.want) {
				t.Errorf("%s: exit %d, stdout %q, stderr %q, want a refusal saying %q", tc.name, code, out, stderr, tc.want)
			}
		}
	})
}

// TestJobContainers starts containers inside airlock run, as pilots do
// (bubblewrap with its own user namespace, unshare -U, unshare -Urm): each
// reaches the outside through the job's tunnel, since it shares the job's
// network namespace; a container with its own network namespace (bwrap
// --unshare-net) has none, as on the bare node. airlock run --check
// reports that containers are allowed.
func TestJobContainers(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("bwrap not installed: run scripts/setup.sh")
		}
		t.Skip("bwrap not installed: run scripts/setup.sh")
	}
	e := newEnv(t)
	url := fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)
	get := "curl -sS --max-time 30 " + url + " | sha256sum"
	for _, tc := range []struct{ name, cmd string }{
		{"bwrap", "bwrap --unshare-user --unshare-pid --dev-bind / / sh -c '" + get + "'"},
		{"unshare -U", "unshare -U sh -c '" + get + "'"},
		{"unshare -Urm", "unshare -Urm sh -c '" + get + "'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := e.runWith(t, runOpts{}, "sh", "-c", tc.cmd)
			if code != 0 || !strings.HasPrefix(out, e.sha["small"]) {
				t.Fatalf("%s in the job: exit %d, %q, want sha %s%s", tc.cmd, code, out, e.sha["small"], e.diag(stderr))
			}
		})
	}
	t.Run("OwnNetwork", func(t *testing.T) {
		code, out, stderr := e.runWith(t, runOpts{}, "bwrap", "--unshare-user", "--unshare-net", "--dev-bind", "/", "/",
			"curl", "-sS", "--max-time", "5", url)
		if code == 0 {
			t.Fatalf("a container with its own network reached %s: %q%s", url, out, e.diag(stderr))
		}
	})
	t.Run("Check", func(t *testing.T) {
		_, out, stderr := e.tp.Run(t, 60*time.Second, e.tp.CN, e.u, e.airlock, "run", "--check", "--gateway", e.gateway, "--pin", e.pin)
		if !strings.Contains(out+stderr, "containers in jobs") {
			t.Errorf("--check does not report containers in jobs:\n%s%s", out, stderr)
		}
	})
}
