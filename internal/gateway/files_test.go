// SPDX-License-Identifier: MIT

package gateway

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-vpn/airlock/internal/fdlimit"
)

// emfileListener fails every Accept for lack of file descriptors.
type emfileListener struct{ net.Listener }

func (emfileListener) Accept() (net.Conn, error) {
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// TestFilesListener: the control API's listener passes an accept's
// EMFILE on (net/http retries it) and warns once a minute, naming the fix.
func TestFilesListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	var buf bytes.Buffer
	l := &filesListener{Listener: emfileListener{inner}, warn: fdlimit.NewWarner(slog.New(slog.NewTextHandler(&buf, nil)))}
	for range 3 {
		if _, err := l.Accept(); !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("Accept: %v, want EMFILE passed on", err)
		}
	}
	if got := strings.Count(buf.String(), "out of file descriptors"); got != 1 || !strings.Contains(buf.String(), "LimitNOFILE") {
		t.Errorf("warnings: %d, want 1 naming LimitNOFILE:\n%s", got, buf.String())
	}
}
