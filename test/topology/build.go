package topology

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// buildOnce runs go build -o BINDIR/name pkg (a path relative to the
// module root) once per process and returns the output path.
func buildOnce(t testing.TB, name, pkg string, env ...string) string {
	t.Helper()
	bin.mu.Lock()
	if bin.builds == nil {
		bin.builds = map[string]*build{}
	}
	b := bin.builds[name]
	if b == nil {
		b = &build{}
		bin.builds[name] = b
	}
	bin.mu.Unlock()
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
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
			return
		}
		if err := os.Chmod(out, 0o755); err != nil {
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

// BuildAirlock builds the airlock binary (CGO_ENABLED=0 go build
// ./cmd/airlock) once per process and returns its path.
func BuildAirlock(t testing.TB) string {
	t.Helper()
	return buildOnce(t, "airlock", "./cmd/airlock", "CGO_ENABLED=0")
}
