// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/httpjson"
	"github.com/airlock-vpn/airlock/internal/store"
)

// startGateway runs an admin server over a store in a new state dir and
// returns the dir and the store.
func startGateway(t *testing.T) (string, *store.Store, *Server) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(nil, st)
	// Listen returns with the socket open: Dial needs no retries.
	l, err := Listen(filepath.Join(dir, SocketName))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeListener(l) }()
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		st.Close()
	})
	return dir, st, srv
}

// tokenOps runs the package-level token functions against stateDir and
// checks results in the store that open returns.
func tokenOps(t *testing.T, dir string) {
	ctx := context.Background()
	secret, tok, err := CreateToken(ctx, dir, "ci", time.Hour)
	if err != nil {
		t.Fatalf("CreateToken: %v", err)
	}
	if tok.Name != "ci" || tok.Expires.IsZero() || len(secret) < 40 {
		t.Errorf("got token %+v secret %q, want ci with expiry", tok, secret)
	}
	if _, gen, err := CreateToken(ctx, dir, "", 0); err != nil || gen.Name == "" {
		t.Errorf("CreateToken generated: got %+v, %v", gen, err)
	}
	if _, _, err := CreateToken(ctx, dir, "ci", 0); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate: got %v, want store.ErrExists", err)
	}
	if _, _, err := CreateToken(ctx, dir, "bad name", 0); !errors.Is(err, store.ErrInvalidName) {
		t.Errorf("bad name: got %v, want store.ErrInvalidName", err)
	}
	toks, err := ListTokens(ctx, dir)
	if err != nil {
		t.Fatalf("ListTokens: %v", err)
	}
	if len(toks) != 2 {
		t.Errorf("got %d tokens, want 2", len(toks))
	}
	if _, err := RevokeToken(ctx, dir, "ci"); err != nil {
		t.Fatalf("RevokeToken: %v", err)
	}
	if _, err := RevokeToken(ctx, dir, "ci"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second revoke: got %v, want store.ErrNotFound", err)
	}
	if _, err := RevokeToken(ctx, dir, "../../x"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoke odd name: got %v, want store.ErrNotFound", err)
	}
	toks, err = ListTokens(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 1 {
		t.Errorf("got %d tokens after revoke, want 1", len(toks))
	}
}

func TestTokensThroughSocket(t *testing.T) {
	dir, st, _ := startGateway(t)
	tokenOps(t, dir)
	// The server's store saw the operations (the db is locked by the
	// gateway, so they cannot have gone to the file directly).
	toks, err := st.Tokens()
	if err != nil {
		t.Fatal(err)
	}
	if len(toks) != 1 {
		t.Errorf("got %d tokens in the gateway's store, want 1", len(toks))
	}
	fi, err := os.Stat(filepath.Join(dir, SocketName))
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("got socket mode %o, want 600", got)
	}
}

func TestTokensWithoutGateway(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	ctx := context.Background()
	toks, err := ListTokens(ctx, dir)
	if err != nil || len(toks) != 0 {
		t.Fatalf("ListTokens on missing dir: got %v, %v; want none", toks, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("ListTokens created %s", dir)
	}
	if _, err := RevokeToken(ctx, dir, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("RevokeToken on missing dir: got %v, want ErrNotFound", err)
	}
	tokenOps(t, dir)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Errorf("got state dir mode %o, want 700", got)
	}
	st, err := store.Open(filepath.Join(dir, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if toks, _ := st.Tokens(); len(toks) != 1 {
		t.Errorf("got %d tokens in the db, want 1", len(toks))
	}
}

func TestDialNoGateway(t *testing.T) {
	dir := t.TempDir()
	if _, err := Dial(dir); !errors.Is(err, ErrNoGateway) {
		t.Errorf("no socket: got %v, want ErrNoGateway", err)
	}
	// A stale socket file with nobody listening.
	l, err := net.Listen("unix", filepath.Join(dir, SocketName))
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if _, err := Dial(dir); !errors.Is(err, ErrNoGateway) {
		t.Errorf("stale socket: got %v, want ErrNoGateway", err)
	}
}

func TestServeReplacesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SocketName)
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	st, err := store.Open(filepath.Join(dir, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := NewServer(nil, st)
	// Listen (Serve's first step) removes the stale socket file and
	// returns with the socket open.
	l, err = Listen(path)
	if err != nil {
		t.Fatalf("Listen on a stale socket: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeListener(l) }()
	c, err := Dial(dir)
	if err != nil {
		t.Fatalf("Dial after stale socket: %v", err)
	}
	if _, err := c.Tokens(context.Background()); err != nil {
		t.Errorf("Tokens: %v", err)
	}
	c.Close()

	// A second server on a live socket must refuse, not steal it.
	if err := NewServer(nil, st).Serve(path); err == nil {
		t.Errorf("second Serve on live socket: got nil, want error")
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file left after Close: %v", err)
	}
}

func TestServeRefusesNonSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SocketName)
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := NewServer(nil, nil).Serve(path); err == nil {
		t.Errorf("got nil, want error for a regular file")
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("regular file removed: %v", err)
	}
}

func TestHandle(t *testing.T) {
	dir, _, srv := startGateway(t)
	srv.Handle("GET /v1/ping", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusOK, map[string]string{"pong": "yes"})
	}))
	c, err := Dial(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got map[string]string
	if err := c.Do(context.Background(), http.MethodGet, "/v1/ping", nil, &got); err != nil {
		t.Fatal(err)
	}
	if got["pong"] != "yes" {
		t.Errorf("got %v, want pong", got)
	}
}
