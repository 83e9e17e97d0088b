// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-vpn/airlock/internal/syncbuf"
)

// TestDialOutOfFiles: a gateway out of file descriptors says so, once a
// minute, with the fix, and counts every such failure; other dial errors
// do not raise the warning.
func TestDialOutOfFiles(t *testing.T) {
	var logs syncbuf.Buffer
	errno := syscall.EMFILE
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("socket", errno)}
	}
	s, err := New(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Addrs: []netip.Prefix{gwPrefix}, Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src, dst := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddrPort("198.51.100.7:53")
	for range 3 {
		if _, err := s.dial(context.Background(), src, "udp4", dst); !strings.Contains(err.Error(), "too many open files") {
			t.Fatalf("dial: %v, want the EMFILE error itself", err)
		}
	}
	errno = syscall.ECONNREFUSED
	s.dial(context.Background(), src, "udp4", dst)
	if got := strings.Count(logs.String(), "out of file descriptors"); got != 1 {
		t.Errorf("warnings: %d, want 1 (one a minute):\n%s", got, logs.String())
	}
	if !strings.Contains(logs.String(), "LimitNOFILE") || !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("the warning does not name the fix (LimitNOFILE) at level WARN:\n%s", logs.String())
	}
	if n := s.Counters().NoFiles; n != 3 {
		t.Errorf("Counters().NoFiles = %d, want 3", n)
	}
}
