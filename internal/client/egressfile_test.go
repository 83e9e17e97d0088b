// SPDX-License-Identifier: MIT

package client

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
)

// TestEgressFile checks that the job's egress file names the current
// lease's egress and gateway, is rewritten after a failover and goes with
// the session.
func TestEgressFile(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	s := &Session{log: slog.New(slog.NewTextHandler(io.Discard, nil)), egressOn: true}
	s.cur = &gatewayEntry{addr: "gw1:8443"}
	s.lease = control.Lease{PublicAddrs: []netip.Addr{netip.MustParseAddr("203.0.113.1")}, Ports: [2]uint16{20000, 20255}}
	s.writeEgressFile()
	f := s.egressFile()
	if fi, err := os.Stat(filepath.Dir(f)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("egress file's directory: %v %v, want mode 0700", fi, err)
	}
	want := "AIRLOCK_EGRESS_ADDR=203.0.113.1\nAIRLOCK_EGRESS_PORTS=20000-20255\nAIRLOCK_GATEWAY=gw1:8443\n"
	if b, err := os.ReadFile(f); err != nil || string(b) != want {
		t.Fatalf("egress file: %q %v, want %q", b, err, want)
	}
	// A failover: another gateway, another block.
	s.cur = &gatewayEntry{addr: "gw2:8443"}
	s.lease = control.Lease{PublicAddrs: []netip.Addr{netip.MustParseAddr("203.0.114.1")}, Ports: [2]uint16{30000, 30015}}
	s.writeEgressFile()
	want = "AIRLOCK_EGRESS_ADDR=203.0.114.1\nAIRLOCK_EGRESS_PORTS=30000-30015\nAIRLOCK_GATEWAY=gw2:8443\n"
	if b, err := os.ReadFile(s.egressFile()); err != nil || string(b) != want || s.egressFile() != f {
		t.Fatalf("egress file after failover: %q %v at %s, want %q at %s", b, err, s.egressFile(), want, f)
	}
	s.removeEgressFile()
	if _, err := os.Stat(filepath.Dir(f)); !os.IsNotExist(err) {
		t.Fatalf("egress file's directory after the session: %v, want removed", err)
	}
}
