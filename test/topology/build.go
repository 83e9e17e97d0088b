// SPDX-License-Identifier: MIT

package topology

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Binaries are built once per test process into one directory with mode
// 0755, so that the unprivileged test user can execute them (the go-build
// directory of a test binary is not readable by other users).
var bin struct {
	once sync.Once
	dir  string
	err  error

	mu     sync.Mutex
	builds map[string]*build // guarded by mu: by output name
}

type build struct {
	once sync.Once
	path string
	err  error
}

// binDir returns the shared binary directory, creating it on first use.
func binDir() (string, error) {
	bin.once.Do(func() {
		bin.dir, bin.err = os.MkdirTemp("", "airlock-testbin-")
		if bin.err == nil {
			bin.err = os.Chmod(bin.dir, 0o755)
		}
	})
	return bin.dir, bin.err
}

// Main runs the tests of a package that uses this harness and then removes
// the binaries it built. Use it from TestMain:
//
//	func TestMain(m *testing.M) { topology.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if bin.dir != "" {
		_ = os.RemoveAll(bin.dir)
	}
	os.Exit(code)
}

// ModuleRoot returns the directory of the go.mod that contains the current
// working directory.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

func getBuild(name string) *build {
	bin.mu.Lock()
	defer bin.mu.Unlock()
	if bin.builds == nil {
		bin.builds = map[string]*build{}
	}
	b := bin.builds[name]
	if b == nil {
		b = &build{}
		bin.builds[name] = b
	}
	return b
}

// buildOnce runs go build -o BINDIR/name pkg (a path relative to the
// module root) once per process and returns the output path.
func buildOnce(t testing.TB, name, pkg string, env ...string) string {
	t.Helper()
	return compileOnce(t, name, 0o755, func(out string) []string { return []string{"go", "build", "-o", out, pkg} }, env...)
}

// compileOnce runs the command argv(BINDIR/name) in the module root with
// env added (at most 5 minutes) once per process, gives its output mode
// and returns the output's path.
func compileOnce(t testing.TB, name string, mode os.FileMode, argv func(out string) []string, env ...string) string {
	t.Helper()
	b := getBuild(name)
	b.once.Do(func() {
		dir, err := binDir()
		if err != nil {
			b.err = err
			return
		}
		root, err := ModuleRoot()
		if err != nil {
			b.err = err
			return
		}
		out := filepath.Join(dir, name)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		args := argv(out)
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, msg)
			return
		}
		if err := os.Chmod(out, mode); err != nil {
			b.err = err
			return
		}
		b.path = out
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", name, b.err)
	}
	return b.path
}

// BuildPeer builds airlock-testpeer once per process and returns its path.
func BuildPeer(t testing.TB) string {
	t.Helper()
	return buildOnce(t, "airlock-testpeer", "./test/topology/cmd/airlock-testpeer", "CGO_ENABLED=0")
}

// BuildRR builds the benchmark's TCP request/response probe (bench/rr)
// once per test binary and returns its path.
func BuildRR(t testing.TB) string {
	t.Helper()
	return buildOnce(t, "airlock-rr", "./bench/rr", "CGO_ENABLED=0")
}

// AirlockBinEnv names an environment variable that, when set, gives a
// prebuilt airlock binary to use instead of building ./cmd/airlock.
const AirlockBinEnv = "AIRLOCK_TEST_BIN"

// BuildAirlock builds the airlock binary (CGO_ENABLED=0 go build
// ./cmd/airlock) once per process and returns its path. If AIRLOCK_TEST_BIN
// is set, it copies that binary instead.
func BuildAirlock(t testing.TB) string {
	t.Helper()
	if src := os.Getenv(AirlockBinEnv); src != "" {
		return copyOnce(t, "airlock", src, 0o755)
	}
	return buildOnce(t, "airlock", "./cmd/airlock", "CGO_ENABLED=0")
}

// copyOnce copies src into the shared binary directory as name, with
// mode, once per process.
func copyOnce(t testing.TB, name, src string, mode os.FileMode) string {
	t.Helper()
	b := getBuild(name)
	b.once.Do(func() { b.path, b.err = installFile(src, name, mode) })
	if b.err != nil {
		t.Fatalf("copy %s: %v", name, b.err)
	}
	return b.path
}

// installFile copies src into the shared binary directory as name with
// mode (set explicitly, whatever the umask) and returns its path.
func installFile(src, name string, mode os.FileMode) (string, error) {
	dir, err := binDir()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("%s: %w", src, err)
	}
	out := filepath.Join(dir, name)
	if err := os.WriteFile(out, data, mode); err != nil {
		return "", err
	}
	if err := os.Chmod(out, mode); err != nil {
		return "", err
	}
	return out, nil
}

// PreloadLibrary is the file name of airlock's LD_PRELOAD library.
const PreloadLibrary = "libairlock-preload.so"

// PreloadLibEnv names an environment variable that, when set, gives a
// prebuilt preload library to use instead of building preload/.
const PreloadLibEnv = "AIRLOCK_TEST_PRELOAD"

// BuildPreload builds the LD_PRELOAD library (make -C preload) once per
// process and puts it into the shared binary directory, next to the airlock
// binary, where airlock run --mode preload finds it. It returns its path.
// If AIRLOCK_TEST_PRELOAD is set, it copies that file instead.
func BuildPreload(t testing.TB) string {
	t.Helper()
	if src := os.Getenv(PreloadLibEnv); src != "" {
		return copyOnce(t, PreloadLibrary, src, 0o644)
	}
	b := getBuild(PreloadLibrary)
	b.once.Do(func() {
		root, err := makeIn("preload", "")
		if err != nil {
			b.err = err
			return
		}
		b.path, b.err = installFile(filepath.Join(root, "preload", PreloadLibrary), PreloadLibrary, 0o644)
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", PreloadLibrary, b.err)
	}
	return b.path
}

// makeIn runs make -s in the module's directory dir (at most 2 minutes) and
// returns the module root; hint, if set, says what the build needs.
func makeIn(dir, hint string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if msg, err := exec.CommandContext(ctx, "make", "-s", "-C", filepath.Join(root, dir)).CombinedOutput(); err != nil {
		if hint != "" {
			hint = " (" + hint + ")"
		}
		return "", fmt.Errorf("make -C %s%s: %v\n%s", dir, hint, err, msg)
	}
	return root, nil
}
