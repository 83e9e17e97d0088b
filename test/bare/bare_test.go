// SPDX-License-Identifier: MIT

// Package bare tests the README's set-up on a machine that has nothing but
// Debian 12 and its package manager: a scratch root made by debootstrap,
// with no Go in it, builds bin/airlock through the README's own command.
package bare

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// cacheDir keeps what makes the test slow the first time and nothing that
// decides its outcome: the debootstrap root (topology.DebianRoot, read-only
// below an overlay), the .debs apt downloaded, the Go module proxy's files (a file:// proxy in
// front of the host's own GOPROXY; the go command still checks every
// module, the toolchain included, against go.sum and the checksum
// database) and the Go build cache.
const cacheDir = topology.DebianRootCache + "/bare-debian12"

// chrootScript runs in a private mount namespace: an overlay on the cached
// root (so that every run starts from the same bare system and leaves it
// unchanged), the kernel's file systems, the caches, and a copy of the
// source tree in /src. Inside, as on a fresh machine: install make (the
// README says so), then the README's first command, make demo: set-up,
// build, and the demo's namespace topology with a job through a gateway.
// The kernel refuses user namespaces to a chrooted process, so the demo's
// jobs fall back to the seccomp mode here, as they say.
const chrootScript = `set -eu
r=$WORK/merged
mkdir -p "$WORK/up" "$WORK/ovl" "$r"
mount -t overlay overlay -o "lowerdir=$ROOT,upperdir=$WORK/up,workdir=$WORK/ovl" "$r"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
cp /etc/resolv.conf "$r/etc/resolv.conf"
# The host's own certificate authorities (a site's TLS-inspecting proxy,
# say), which ca-certificates adds to the root's store when setup installs it.
if [ -d /usr/local/share/ca-certificates ]; then
	cp -r /usr/local/share/ca-certificates/. "$r/usr/local/share/ca-certificates/"
fi
for d in apt-archives goproxy gobuild; do mkdir -p "$CACHE/$d"; done
mkdir -p "$r/var/cache/apt/archives" "$r/cache/goproxy" "$r/root/.cache/go-build"
mount --bind "$CACHE/apt-archives" "$r/var/cache/apt/archives"
mount --bind "$CACHE/goproxy" "$r/cache/goproxy"
mount --bind "$CACHE/gobuild" "$r/root/.cache/go-build"
mkdir "$r/src"
tar -C "$SRC" -cf - -T "$WORK/files" | tar -C "$r/src" -xf -
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
	GOPROXY="file:///cache/goproxy,$HOSTPROXY" \
	chroot "$r" /bin/sh -c '
	set -e
	! command -v go
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make >/dev/null
	cd /src && make demo
	bin/airlock version
	ls -l bin/toolchain
	systemctl list-unit-files 2>/dev/null | grep enabled || true
' >"$WORK/log" 2>&1 || { echo "exit $?" >>"$WORK/log"; exit 1; }
# What the run fetched, for the next one.
cp -an "$r/root/go/pkg/mod/cache/download/." "$CACHE/goproxy/"
`

// TestBareDebian12 makes (once, then from the cache) a minimal Debian 12
// root with debootstrap, and runs `make demo` in it, which must install
// Debian's Go and only the demo's packages, fetch the toolchain go.mod
// names as a module, build bin/airlock with it and run the demo.
func TestBareDebian12(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the bare-Debian demo takes minutes")
	}
	root := topology.DebianRoot(t, "bare-debian12", "bookworm", "")
	if _, err := os.Stat(filepath.Join(root, "usr", "bin", "go")); err == nil {
		t.Fatalf("the cached root %s has a go: remove it and run again", root)
	}

	src, err := topology.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	// The source tree as a clone would have it: every file git knows and
	// every new one it does not ignore.
	files, err := exec.Command("git", "-C", src, "ls-files", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var keep bytes.Buffer
	for _, f := range strings.Split(string(files), "\n") {
		if _, err := os.Lstat(filepath.Join(src, f)); f != "" && err == nil {
			fmt.Fprintln(&keep, f)
		}
	}
	if err := os.WriteFile(filepath.Join(work, "files"), keep.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// The module proxy this host's go uses (a site's own, or the Go
	// project's default), behind the cache.
	hostProxy, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		t.Fatalf("go env GOPROXY: %v", err)
	}
	start := time.Now()
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", chrootScript)
	cmd.Env = append(os.Environ(), "WORK="+work, "ROOT="+root, "CACHE="+cacheDir, "SRC="+src, "HOSTPROXY="+strings.TrimSpace(string(hostProxy)))
	out, err := cmd.CombinedOutput()
	log, _ := os.ReadFile(filepath.Join(work, "log"))
	if err != nil {
		t.Fatalf("make demo in a bare Debian 12 root: %v\n%s\n%s", err, out, tail(log))
	}
	t.Logf("make demo in a bare Debian 12 root: %s", time.Since(start).Round(time.Second))
	s := string(log)
	gomod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^toolchain (go\S+)$`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no toolchain line")
	}
	tc := string(m[1])
	for _, want := range []string{
		// nothing but what the demo needs
		"setup: installing Debian packages: gcc libc6-dev ca-certificates git iproute2 iputils-ping procps curl iperf3 golang-go",
		"setup: go1.19", // Debian's go, too old...
		"fetching golang.org/toolchain@v0.0.1-" + tc + ".linux-", // ...fetches the toolchain as a module
		"setup: built bin/airlock, bin/libairlock-preload.so with " + tc,
		"HTTP:      20971520 bytes in", // the demo's job, through the gateway
		"== done; cleaning up",
		"commit:", // bin/airlock version
		"bin/toolchain -> /root/go/pkg/mod/golang.org/toolchain@v0.0.1-" + tc + ".linux-",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("make demo's output in the bare Debian root lacks %q:\n%s", want, tail(log))
		}
	}
	for _, never := range []string{"slurm", "postgresql", "prometheus", "squid"} {
		if strings.Contains(s, never) {
			t.Errorf("make demo in a bare Debian 12 root mentions %s:\n%s", never, tail(log))
		}
	}
}

// tail returns the last 60 lines of b.
func tail(b []byte) string {
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > 60 {
		l = l[len(l)-60:]
	}
	return strings.Join(l, "\n")
}

// testServices are the services of the tools the tests start themselves
// (scripts/setup.sh's services).
var testServices = []string{"munge", "slurmctld", "slurmd", "prometheus", "squid", "postgresql"}

// TestNoTestServiceAtBoot checks this machine after scripts/setup.sh test
// (make test runs it first): none of the test tools' services is enabled
// for the next boot, neither as a systemd unit nor by sysvinit's links.
func TestNoTestServiceAtBoot(t *testing.T) {
	if _, err := os.Stat("/var/lib/dpkg/status"); err != nil {
		t.Skip("not a Debian system")
	}
	for _, s := range testServices {
		links, _ := filepath.Glob("/etc/systemd/system/*.wants/" + s + ".service")
		rc, _ := filepath.Glob("/etc/rc[2-5].d/S[0-9][0-9]" + s)
		if len(links)+len(rc) > 0 {
			t.Errorf("%s starts at boot (%s): scripts/setup.sh test disables it", s, strings.Join(append(links, rc...), " "))
		}
	}
}
