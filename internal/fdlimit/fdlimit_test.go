// SPDX-License-Identifier: MIT

package fdlimit

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestNote: EMFILE and ENFILE, wrapped as the net package returns them,
// are exhaustion and warn once a minute naming the fix; other errors are
// neither.
func TestNote(t *testing.T) {
	var buf bytes.Buffer
	w := NewWarner(slog.New(slog.NewTextHandler(&buf, nil)))
	wrap := func(e syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
	}
	for _, err := range []error{wrap(syscall.EMFILE), wrap(syscall.ENFILE), wrap(syscall.EMFILE)} {
		if !w.Note(err, "a test failed") {
			t.Errorf("Note(%v) = false, want exhaustion", err)
		}
	}
	for _, err := range []error{wrap(syscall.ECONNREFUSED), errors.New("too many open files"), nil} {
		if w.Note(err, "a test failed") {
			t.Errorf("Note(%v) = true, want not exhaustion", err)
		}
	}
	if out := buf.String(); strings.Count(out, "out of file descriptors: a test failed;") != 1 || !strings.Contains(out, "LimitNOFILE") || !strings.Contains(out, "level=WARN") {
		t.Errorf("log: want one WARN naming LimitNOFILE:\n%s", out)
	}
}
