// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control/controltest"
)

// TestBearerDiscovery follows the WLCG Bearer Token Discovery order
// (BEARER_TOKEN, BEARER_TOKEN_FILE, $XDG_RUNTIME_DIR/bt_u$UID,
// /tmp/bt_u$UID) and refuses files another user could have planted.
func TestBearerDiscovery(t *testing.T) {
	const a, b, c, d = "h.a.s", "h.b.s", "h.c.s", "h.d.s"
	dir := t.TempDir()
	xdg, tmp := filepath.Join(dir, "xdg"), filepath.Join(dir, "tmp")
	for _, p := range []string{xdg, tmp} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	name := "bt_u" + strconv.Itoa(os.Getuid())
	write := func(p, v string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(dir, "tok")
	write(file, b, 0o600)
	write(filepath.Join(xdg, name), c, 0o600)
	write(filepath.Join(tmp, name), d, 0o600)

	find := func(env map[string]string) (string, string, error) {
		bt, err := newJobBearer("", func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		bt.tmp = tmp
		return bt.find()
	}
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
		err  string
	}{
		{"env wins", map[string]string{"BEARER_TOKEN": a, "BEARER_TOKEN_FILE": file, "XDG_RUNTIME_DIR": xdg}, a, ""},
		{"file", map[string]string{"BEARER_TOKEN_FILE": file, "XDG_RUNTIME_DIR": xdg}, b, ""},
		{"xdg", map[string]string{"XDG_RUNTIME_DIR": xdg}, c, ""},
		{"tmp", map[string]string{}, d, ""},
		{"tmp when xdg has none", map[string]string{"XDG_RUNTIME_DIR": dir}, d, ""},
		{"named file missing", map[string]string{"BEARER_TOKEN_FILE": filepath.Join(dir, "nope")}, "", "no such file"},
		{"not a jwt", map[string]string{"BEARER_TOKEN": "secret"}, "", "not a JWT"},
	} {
		got, _, err := find(tt.env)
		if got != tt.want || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: got %q, %v; want %q, %q", tt.name, got, err, tt.want, tt.err)
		}
	}

	// A token file others may write is refused, not used.
	write(filepath.Join(tmp, name), d, 0o666)
	if got, _, err := find(map[string]string{}); got != "" || err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("world-writable token file: got %q, %v; want a refusal", got, err)
	}
	// One of another user (a neighbour's plant in /tmp).
	if os.Getuid() == 0 {
		write(filepath.Join(tmp, name), d, 0o600)
		if err := os.Chown(filepath.Join(tmp, name), 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if got, _, err := find(map[string]string{}); got != "" || err == nil || !strings.Contains(err.Error(), "owned by uid 4242") {
			t.Errorf("another user's token file: got %q, %v; want a refusal", got, err)
		}
	}
	// A symlink is not followed.
	_ = os.Remove(filepath.Join(tmp, name))
	if err := os.Symlink(file, filepath.Join(tmp, name)); err != nil {
		t.Fatal(err)
	}
	if got, _, err := find(map[string]string{}); got != "" || err == nil {
		t.Errorf("symlinked token file: got %q, %v; want a refusal", got, err)
	}
	// Off: nothing, whatever the environment.
	bt, _ := newJobBearer(BearerOff, func(string) string { return a })
	if got, _, err := bt.find(); got != "" || err != nil {
		t.Errorf("off: got %q, %v", got, err)
	}
	if _, err := newJobBearer("on", os.Getenv); err == nil {
		t.Error("bad mode accepted")
	}
}

// TestBearerAsksOnlyWithToken checks that a job without a bearer token
// joins its one gateway without first asking for its load report (whether
// it takes bearer tokens): that report cost every job a round trip before
// its join. A job with a token asks, and presents it only where the
// gateway takes it.
func TestBearerAsksOnlyWithToken(t *testing.T) {
	for _, tt := range []struct {
		name    string
		env     map[string]string
		healths int
	}{
		{"no token", map[string]string{}, 0},
		{"token", map[string]string{"BEARER_TOKEN": "h.a.s"}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := &controltest.Backend{}
			g := controltest.Start(t, b, controltest.Options{})
			s := newTestSession(t, g, nil, 5*time.Second)
			bt, err := newJobBearer("", func(k string) string { return tt.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			bt.tmp = t.TempDir() // no /tmp/bt_uUID of the machine's
			s.bearer = bt
			if err := s.Join(context.Background()); err != nil {
				t.Fatalf("join: %v", err)
			}
			if got := b.Healths(); got != tt.healths {
				t.Errorf("load reports asked before the join: got %d, want %d", got, tt.healths)
			}
			if bt.used {
				t.Errorf("bearer token presented to a gateway that does not take them")
			}
		})
	}
}
