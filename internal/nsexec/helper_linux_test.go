// SPDX-License-Identifier: MIT

package nsexec

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/topology"
)

// The test binary doubles as the program under test: TestMain calls Init so
// that a re-executed namespace child works, and with helperEnv set,
// TestHelperJob runs one scenario (as an unprivileged user, under setpriv)
// and prints its result after resultMarker.
const (
	helperEnv    = "AIRLOCK_NSEXEC_TEST_HELPER" // JSON helperSpec
	resultMarker = "HELPER-RESULT: "
	pidMarker    = "HELPER-JOB-PID: "
)

func TestMain(m *testing.M) {
	Init()
	os.Exit(m.Run())
}

// helperSpec selects what TestHelperJob does.
type helperSpec struct {
	Mode          string   // "job", "preflight", "orphan", "bind"
	Args          []string // job command
	DNS           []string
	SignalOnLine  string // send SIGTERM when the job prints this line
	BackgroundPID bool   // the job's first output line is a PID it left running
	Dir           string // "bind": directory with the files to bind over
}

// helperResult is what TestHelperJob reports.
type helperResult struct {
	UID            int
	StartErr       string
	TUNName        string
	TUNFlags       uint16
	Status         int
	WaitErr        string
	Stdout, Stderr string
	BackgroundPID  int
	BgAliveBefore  bool
	BgGoneAfter    bool
	PreflightErr   string
	Bind           map[string]string // "bind": file → content read after binding, or error
}

func TestHelperJob(t *testing.T) {
	raw := os.Getenv(helperEnv)
	if raw == "" {
		return // only a helper when re-executed by the tests below
	}
	// Fds inherited from the test runner must not confuse the checks of
	// what the job inherits.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		t.Fatalf("close_range: %v", err)
	}
	var spec helperSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatalf("decode %s: %v", helperEnv, err)
	}
	var res helperResult
	res.UID = os.Getuid()
	switch spec.Mode {
	case "preflight":
		if err := Preflight(); err != nil {
			res.PreflightErr = err.Error()
		}
	case "bind":
		res.Bind = helperBind(t, spec.Dir)
	default:
		helperRunJob(t, spec, &res)
	}
	b, _ := json.Marshal(res)
	fmt.Printf("\n%s%s\n", resultMarker, b)
}

func helperBind(t *testing.T, dir string) map[string]string {
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make mounts private: %v", err)
	}
	out := map[string]string{}
	for _, name := range []string{"regular", "link-to-existing", "link-dangling", "target"} {
		dst := filepath.Join(dir, name)
		if name != "target" {
			if err := bindResolvConf(dst, []netip.Addr{netip.MustParseAddr("192.0.2.53")}); err != nil {
				out[name] = "error: " + err.Error()
				continue
			}
		}
		b, err := os.ReadFile(dst)
		if err != nil {
			out[name] = "error: " + err.Error()
			continue
		}
		out[name] = string(b)
	}
	return out
}

func helperRunJob(t *testing.T, spec helperSpec, res *helperResult) {
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	var dns []netip.Addr
	for _, s := range spec.DNS {
		dns = append(dns, netip.MustParseAddr(s))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j, err := Start(ctx, Config{
		Args:     spec.Args,
		Stdout:   outW,
		Stderr:   errW,
		Addrs:    []netip.Prefix{netip.MustParsePrefix("100.64.0.2/16")},
		Gateways: []netip.Addr{netip.MustParseAddr("100.64.0.1")},
		MTU:      1380,
		DNS:      dns,
	})
	if err != nil {
		res.StartErr = err.Error()
		return
	}
	defer j.Cleanup()
	defer j.TUN().Close()
	watchdog := time.AfterFunc(20*time.Second, j.Cleanup)
	defer watchdog.Stop()

	ifr, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(int(j.TUN().Fd()), unix.TUNGETIFF, ifr); err == nil {
		res.TUNName, res.TUNFlags = ifr.Name(), ifr.Uint16()
	}
	if err := j.Run(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if spec.Mode == "orphan" {
		fmt.Printf("\n%s%d\n", pidMarker, j.Pid())
		time.Sleep(30 * time.Second) // the test kills us
		return
	}
	outW.Close()
	errW.Close()

	var wg sync.WaitGroup
	var stdout, stderr strings.Builder
	firstLine := make(chan string, 1)
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(firstLine)
		sc := bufio.NewScanner(outR)
		for n := 0; sc.Scan(); n++ {
			line := sc.Text()
			stdout.WriteString(line + "\n")
			if n == 0 {
				firstLine <- line
			}
			if spec.SignalOnLine != "" && line == spec.SignalOnLine {
				if err := j.Signal(syscall.SIGTERM); err != nil {
					t.Errorf("signal: %v", err)
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		b, _ := io.ReadAll(errR)
		stderr.Write(b)
	}()
	res.Status, err = j.Wait()
	if err != nil {
		res.WaitErr = err.Error()
	}
	if spec.BackgroundPID {
		select {
		case line := <-firstLine:
			res.BackgroundPID, _ = strconv.Atoi(line)
		case <-time.After(5 * time.Second):
		}
		res.BgAliveBefore = res.BackgroundPID > 0 && processAlive(res.BackgroundPID)
	}
	j.Cleanup()
	if spec.BackgroundPID {
		res.BgGoneAfter = waitGone(res.BackgroundPID, 5*time.Second)
	}
	wg.Wait()
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitGone(pid int, d time.Duration) bool {
	return topology.Poll(d, func() bool { return !processAlive(pid) })
}

// helperBinary copies the test binary where other users can run it.
func helperBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "nsexec.test")
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// helperCmd returns the command that runs TestHelperJob with spec: as root
// if tunMode is 0, else as the unprivileged test user with /dev/net/tun of
// mode tunMode (see topology.TUNNode).
func helperCmd(ctx context.Context, t *testing.T, bin string, tunMode os.FileMode, spec helperSpec) *exec.Cmd {
	t.Helper()
	raw, _ := json.Marshal(spec)
	args := []string{bin, "-test.run=^TestHelperJob$", "-test.timeout=60s"}
	if tunMode != 0 {
		args = topology.NewTUNNode(t, tunMode).Command(topology.EnsureUser(t), args...)
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Dir = filepath.Dir(bin)
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/", "TMPDIR=/tmp", "GORACE=atexit_sleep_ms=0", helperEnv + "=" + string(raw)}
	cmd.WaitDelay = time.Second
	return cmd
}

// runHelper runs TestHelperJob with spec like helperCmd and returns its
// result.
func runHelper(t *testing.T, bin string, tunMode os.FileMode, spec helperSpec) helperResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	cmd := helperCmd(ctx, t, bin, tunMode, spec)
	out, err := cmd.CombinedOutput()
	res := parseResult(t, out)
	if err != nil {
		t.Fatalf("helper %+v: %v\n%s", spec, err, out)
	}
	return res
}
