// SPDX-License-Identifier: MIT

package preload_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShortAddressBuffers runs test/shortaddr.c, a program that asks
// recvfrom, recvmsg, accept and getpeername for addresses with buffers
// shorter than the address, under the library; both are built with
// AddressSanitizer, so a byte read or written past the caller's buffer
// fails the run. The library must truncate the relay's stand-in address
// to the caller's room and report the full length, as POSIX says.
func TestShortAddressBuffers(t *testing.T) {
	asan, err := exec.Command("cc", "-print-file-name=libasan.so").Output()
	if err != nil || !filepath.IsAbs(strings.TrimSpace(string(asan))) {
		t.Fatalf("cc has no AddressSanitizer runtime (%v %q): install libasan (gcc)", err, asan)
	}
	lib := buildLib(t, "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer")
	dir := t.TempDir()
	cc := func(args ...string) {
		t.Helper()
		if b, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			t.Fatalf("cc %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	prog := filepath.Join(dir, "shortaddr")
	cc("-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer",
		"-o", prog, "test/shortaddr.c")

	o := startOutside(t)
	socks, _, secret := serveSOCKS(t, o)

	rctx, rcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer rcancel()
	cmd := exec.CommandContext(rctx, prog, "192.0.2.10", "7")
	// The sanitizer's runtime must come first in the library list.
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+strings.TrimSpace(string(asan))+" "+lib,
		"AIRLOCK_SOCKS="+socks, "AIRLOCK_SOCKS_SECRET="+secret, "AIRLOCK_DNS=192.0.2.53",
		"ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:exitcode=99")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(out), "FAIL") || strings.Contains(string(out), "AddressSanitizer") {
		t.Fatalf("shortaddr under the library: %v\n%s", err, out)
	}
	for _, w := range []string{"ok recvfrom-0", "ok recvfrom-8", "ok recvfrom-15", "ok recvmsg-8", "ok recvmsg-8-room", "ok accept-4", "ok getpeername-4"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}
