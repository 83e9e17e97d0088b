// SPDX-License-Identifier: MIT

package munge_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
)

// TestEncodeDecode runs the client against a real munged: the
// credential carries the caller's uid and gid, the payload and the
// origin address; it decodes once, and a second decode is a replay, with
// the credential's fields still reported.
func TestEncodeDecode(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	c := munge.Client{Socket: d.Socket}
	ctx := context.Background()
	payload := []byte("airlock test payload\n\x00\xff")
	cred, err := c.Encode(ctx, payload, munge.EncodeOptions{TTL: 60})
	if err != nil {
		t.Fatalf("encode: %v\n%s", err, d.Log())
	}
	if !strings.HasPrefix(cred, "MUNGE:") || !strings.HasSuffix(cred, ":") {
		t.Errorf("credential %q: want MUNGE:...:", cred)
	}
	got, err := c.Decode(ctx, cred)
	if err != nil {
		t.Fatalf("decode: %v\n%s", err, d.Log())
	}
	if got.UID != uint32(os.Getuid()) || got.GID != uint32(os.Getgid()) || !bytes.Equal(got.Payload, payload) ||
		got.Origin.String() != "127.0.0.1" || got.TTL != time.Minute || time.Since(got.Encoded) > time.Minute ||
		got.AuthUID != munge.AnyID || got.AuthGID != munge.AnyID {
		t.Errorf("decoded %+v, want uid %d gid %d, the payload, origin 127.0.0.1, ttl 60 s, anyone may decode", got, os.Getuid(), os.Getgid())
	}
	again, err := c.Decode(ctx, cred)
	if !errors.Is(err, munge.ErrReplayed) || !munge.IsBadCredential(err) {
		t.Errorf("second decode: %v, want ErrReplayed", err)
	}
	if again.UID != got.UID || !bytes.Equal(again.Payload, payload) {
		t.Errorf("replayed credential's fields %+v, want them reported with the error", again)
	}
}

// TestBadCredentials: another key's credential, garbage, an expired
// credential and a dead socket each give their own error.
func TestBadCredentials(t *testing.T) {
	a := mungetest.Start(t, mungetest.Options{})
	b := mungetest.Start(t, mungetest.Options{})
	ca, cb := munge.Client{Socket: a.Socket}, munge.Client{Socket: b.Socket}
	ctx := context.Background()
	cred, err := ca.Encode(ctx, nil, munge.EncodeOptions{TTL: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Decode(ctx, cred); !errors.Is(err, munge.ErrInvalid) || !munge.IsBadCredential(err) {
		t.Errorf("decode with another key: %v, want ErrInvalid", err)
	}
	if _, err := ca.Decode(ctx, "MUNGE:bm90IGEgY3JlZGVudGlhbA==:"); !munge.IsBadCredential(err) {
		t.Errorf("decode garbage: %v, want a bad credential", err)
	}
	time.Sleep(2100 * time.Millisecond)
	if _, err := ca.Decode(ctx, cred); !errors.Is(err, munge.ErrExpired) {
		t.Errorf("decode after its ttl: %v, want ErrExpired", err)
	}
	dead := munge.Client{Socket: a.Dir + "/nosuch.socket"}
	if _, err := dead.Encode(ctx, nil, munge.EncodeOptions{}); !errors.Is(err, munge.ErrSocket) || munge.IsBadCredential(err) || !strings.Contains(err.Error(), "is munged running") {
		t.Errorf("encode without munged: %v, want ErrSocket saying so", err)
	}
}

// TestInterop checks the wire format against MUNGE's own programs: a
// credential munge(1) makes as another user decodes here with that
// user's uid, and one made here decodes with unmunge(1).
func TestInterop(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	c := munge.Client{Socket: d.Socket}
	ctx := context.Background()
	argv := []string{"munge", "--socket", d.Socket, "--string", "from munge(1)"}
	wantUID := os.Getuid()
	if os.Getuid() == 0 {
		argv = append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}, argv...)
		wantUID = 65534
	}
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(argv, " "), err)
	}
	got, err := c.Decode(ctx, strings.TrimSpace(string(out)))
	if err != nil || got.UID != uint32(wantUID) || string(got.Payload) != "from munge(1)" {
		t.Errorf("decode munge(1)'s credential: %+v %v, want uid %d and its payload", got, err, wantUID)
	}
	cred, err := c.Encode(ctx, []byte("from Go"), munge.EncodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	un := exec.Command("unmunge", "--socket", d.Socket, "--metadata=/dev/stderr", "--output=-")
	un.Stdin = strings.NewReader(cred)
	var meta bytes.Buffer
	un.Stderr = &meta
	out, err = un.Output()
	if err != nil || string(out) != "from Go" || !strings.Contains(meta.String(), "UID:") ||
		!strings.Contains(meta.String(), "("+strconv.Itoa(os.Getuid())+")") {
		t.Errorf("unmunge of this package's credential: %v, %q, metadata %s", err, out, meta.String())
	}
}
