// SPDX-License-Identifier: MIT

package control_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"golang.org/x/time/rate"
)

const testKey = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="

// testKeyValue is testKey parsed.
var testKeyValue, _ = wgkey.Parse(testKey)

func newClient(t *testing.T, gw *controltest.Gateway) *control.Client {
	t.Helper()
	c, err := control.NewClient(gw.Addr, gw.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func joinReq(token string) control.JoinRequest {
	return control.JoinRequest{Token: token, PublicKey: testKeyValue, Job: control.JobInfo{BatchJobID: "42", Hostname: "cn1", UID: 1000}}
}

func TestJoinRenewRelease(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{})
	c := newClient(t, gw)
	ctx := context.Background()

	h, err := c.Health(ctx)
	if err != nil {
		t.Fatalf("Health: %v", err)
	}
	if h.Jobs != 0 {
		t.Errorf("got %d jobs, want 0", h.Jobs)
	}
	lease, err := c.Join(ctx, joinReq(gw.Token(t)))
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if lease.ID == "" || lease.Secret == "" || len(lease.Addresses) == 0 || lease.RenewInterval <= 0 {
		t.Errorf("got incomplete lease %+v", lease)
	}
	ref := control.LeaseRef{ID: lease.ID, Secret: lease.Secret}
	if _, err := c.Renew(ctx, ref); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if h, _ := c.Health(ctx); h.Jobs != 1 {
		t.Errorf("got %d jobs, want 1", h.Jobs)
	}
	_, err = c.Renew(ctx, control.LeaseRef{ID: lease.ID, Secret: "wrong"})
	if !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("renew with wrong secret: got %v, want ErrUnknownLease", err)
	}
	if err := c.Release(ctx, ref); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := c.Release(ctx, ref); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("second release: got %v, want ErrUnknownLease", err)
	}
	want := []string{"join", "renew", "renew", "release", "release"}
	if got := gw.Backend.Calls(); !slices.Equal(got, want) {
		t.Errorf("got backend calls %v, want %v", got, want)
	}
}

func TestBadToken(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{})
	c := newClient(t, gw)
	ctx := context.Background()

	expired, _, err := gw.Store.CreateToken("old", time.Millisecond, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	revoked, _, err := gw.Store.CreateToken("revoked", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Store.RevokeToken("revoked"); err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{
		"unknown": "alk1_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"expired": expired,
		"revoked": revoked,
	} {
		_, err := c.Join(ctx, joinReq(tok))
		if !errors.Is(err, control.ErrBadToken) {
			t.Errorf("%s: got %v, want ErrBadToken", name, err)
			continue
		}
		if !strings.Contains(err.Error(), control.MsgBadToken) {
			t.Errorf("%s: got message %q, want it to contain %q", name, err, control.MsgBadToken)
		}
		var ae *control.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusForbidden || ae.Code != control.CodeBadToken {
			t.Errorf("%s: got %#v, want APIError 403 bad_token", name, ae)
		}
	}
	if calls := gw.Backend.Calls(); len(calls) != 0 {
		t.Errorf("backend called %v for bad tokens, want no calls", calls)
	}
}

func TestRateLimit(t *testing.T) {
	const burst = 3
	gw := controltest.Start(t, nil, controltest.Options{FailureLimit: rate.Every(time.Minute), FailureBurst: burst})
	c := newClient(t, gw)
	ctx := context.Background()
	good := gw.Token(t)
	bad := joinReq("alk1_nope")

	for i := 0; i < burst; i++ {
		if _, err := c.Join(ctx, bad); !errors.Is(err, control.ErrBadToken) {
			t.Fatalf("attempt %d: got %v, want ErrBadToken", i+1, err)
		}
	}
	_, err := c.Join(ctx, bad)
	if !errors.Is(err, control.ErrRateLimited) {
		t.Fatalf("attempt %d: got %v, want ErrRateLimited", burst+1, err)
	}
	var ae *control.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.RetryAfter <= 0 {
		t.Errorf("got %#v, want 429 with Retry-After", ae)
	}
	// While limited, even a good token is refused before it is checked.
	if _, err := c.Join(ctx, joinReq(good)); !errors.Is(err, control.ErrRateLimited) {
		t.Errorf("good token while limited: got %v, want ErrRateLimited", err)
	}
	// Renewals of unknown leases from the same address are refused too
	// (lease guessing); live leases are not (TestLeaseRequestsNotLimited).
	if _, err := c.Renew(ctx, control.LeaseRef{ID: "x", Secret: "y"}); !errors.Is(err, control.ErrRateLimited) {
		t.Errorf("renew while limited: got %v, want ErrRateLimited", err)
	}
	// Health is never limited.
	if _, err := c.Health(ctx); err != nil {
		t.Errorf("health while limited: %v", err)
	}
	if calls := gw.Backend.Calls(); slices.Contains(calls, "join") {
		t.Errorf("backend called %v, want no joins", calls)
	}
}

func TestRateLimitRecovers(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{FailureLimit: rate.Every(200 * time.Millisecond), FailureBurst: 1})
	c := newClient(t, gw)
	ctx := context.Background()
	if _, err := c.Join(ctx, joinReq("alk1_nope")); !errors.Is(err, control.ErrBadToken) {
		t.Fatalf("got %v, want ErrBadToken", err)
	}
	if _, err := c.Join(ctx, joinReq(gw.Token(t))); !errors.Is(err, control.ErrRateLimited) {
		t.Fatalf("got %v, want ErrRateLimited", err)
	}
	time.Sleep(250 * time.Millisecond)
	if _, err := c.Join(ctx, joinReq(gw.Token(t))); err != nil {
		t.Fatalf("after refill: got %v, want success", err)
	}
}

func TestPinMismatch(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{})
	other := controltest.Start(t, nil, controltest.Options{})
	c, err := control.NewClient(gw.Addr, other.Pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Join(context.Background(), joinReq(gw.Token(t)))
	if !errors.Is(err, control.ErrPinMismatch) {
		t.Fatalf("got %v, want ErrPinMismatch", err)
	}
	msg := err.Error()
	t.Logf("pin mismatch: %v", err)
	for _, want := range []string{gw.Addr, "presented fingerprint " + gw.Pin, "expected " + other.Pin, "AIRLOCK_PIN"} {
		if !strings.Contains(msg, want) {
			t.Errorf("got message %q, want it to contain %q", msg, want)
		}
	}
	if calls := gw.Backend.Calls(); len(calls) != 0 {
		t.Errorf("backend saw %v, want nothing", calls)
	}
}

func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c, err := control.NewClient(addr, "sha256:"+strings.Repeat("0", 64), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Join(context.Background(), joinReq("alk1_x"))
	if !errors.Is(err, control.ErrUnreachable) {
		t.Fatalf("got %v, want ErrUnreachable", err)
	}
	t.Logf("unreachable: %v", err)
	if d := time.Since(start); d > time.Second {
		t.Errorf("took %v, want a quick failure", d)
	}
	for _, want := range []string{"cannot reach gateway " + addr + " over TCP", "connection refused", "AIRLOCK_GATEWAY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("got message %q, want it to contain %q", err, want)
		}
	}
}

func TestNewClientErrors(t *testing.T) {
	pin := "sha256:" + strings.Repeat("ab", 32)
	if _, err := control.NewClient("gateway-without-port", pin, 0); err == nil || !strings.Contains(err.Error(), "AIRLOCK_GATEWAY") {
		t.Errorf("bad address: got %v, want an error naming AIRLOCK_GATEWAY", err)
	}
	if _, err := control.NewClient("127.0.0.1:1", "sha256:xyz", 0); err == nil || !strings.Contains(err.Error(), "join.env") {
		t.Errorf("bad pin: got %v, want an error naming join.env", err)
	}
}

// rawPost sends body to path with a pinned TLS client, bypassing Client's
// request encoding.
func rawPost(t *testing.T, gw *controltest.Gateway, method, path, body string) (*http.Response, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: control.ClientTLSConfig(gw.Pin)}, Timeout: 5 * time.Second}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(method, "https://"+gw.Addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp, buf.String()
}

func TestBadRequests(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{FailureLimit: rate.Inf})
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantMsg    string
	}{
		{"malformed json", "POST", control.PathJoin, `{"token":`, 400, "bad JSON"},
		{"unknown field", "POST", control.PathJoin, `{"token":"a","public_key":"` + testKey + `","x":1}`, 400, "unknown field"},
		{"bad key", "POST", control.PathJoin, `{"token":"a","public_key":"abc"}`, 400, "WireGuard public key"},
		{"too large", "POST", control.PathJoin, `{"token":"` + strings.Repeat("a", 70<<10) + `"}`, 400, "larger than 64 KiB"},
		{"get join", "GET", control.PathJoin, ``, 405, "method not allowed"},
		{"renew missing secret", "POST", control.PathRenew, `{"id":"x"}`, 400, "missing lease"},
		{"no such path", "GET", "/v2/join", ``, 404, "no such control API path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := rawPost(t, gw, tc.method, tc.path, tc.body)
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("got status %d, want %d (body %s)", resp.StatusCode, tc.wantStatus, body)
			}
			if !strings.Contains(body, `"code":"bad_request"`) || !strings.Contains(body, tc.wantMsg) {
				t.Errorf("got body %s, want bad_request containing %q", body, tc.wantMsg)
			}
		})
	}
}

func TestBackendErrors(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantIs     error
	}{
		{"no address", control.ErrNoAddress, 503, control.ErrNoAddress},
		{"no port block", fmt.Errorf("%w: all 3 port blocks of 20000-20767 are in use; widen --egress-ports or lower --block-size", control.ErrNoAddress), 503, control.ErrNoAddress},
		{"rejected", errors.Join(control.ErrBadRequest, errors.New("public key already joined")), 400, control.ErrBadRequest},
		{"internal", errors.New("disk on fire"), 500, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gw := controltest.Start(t, &controltest.Backend{JoinErr: tc.err}, controltest.Options{})
			c := newClient(t, gw)
			_, err := c.Join(context.Background(), joinReq(gw.Token(t)))
			var ae *control.APIError
			if !errors.As(err, &ae) || ae.Status != tc.wantStatus {
				t.Fatalf("got %v, want APIError with status %d", err, tc.wantStatus)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("got %v, want errors.Is %v", err, tc.wantIs)
			}
			if tc.name == "no port block" && !strings.Contains(err.Error(), "all 3 port blocks of 20000-20767 are in use") {
				t.Errorf("got %v, want the backend's explanation", err)
			}
			if tc.wantStatus == 500 && strings.Contains(err.Error(), "disk on fire") {
				t.Errorf("internal error detail leaked to client: %v", err)
			}
		})
	}
}

// TestTLSVersion checks that the server refuses TLS 1.2.
func TestTLSVersion(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{})
	conf := control.ClientTLSConfig(gw.Pin)
	conf.MinVersion, conf.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	conn, err := tls.Dial("tcp", gw.Addr, conf)
	if err == nil {
		conn.Close()
		t.Fatal("TLS 1.2 handshake succeeded, want failure")
	}
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// TestKeepAlive checks that a join and its renewals share one connection.
func TestKeepAlive(t *testing.T) {
	dir := t.TempDir()
	cert, pin, _, err := control.LoadOrCreateIdentity(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tok, _, err := st.CreateToken("", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := control.NewServer(control.ServerConfig{Store: st, Backend: &controltest.Backend{}, Certificate: cert})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{Listener: inner}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	c, err := control.NewClient(inner.Addr().String(), pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	lease, err := c.Join(ctx, joinReq(tok))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := c.Renew(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret}); err != nil {
		t.Fatal(err)
	}
	if got := l.n.Load(); got != 1 {
		t.Errorf("got %d connections, want 1", got)
	}
}

// unavailableStore answers every token check as a fail-closed fleet
// member that cannot reach its database.
type unavailableStore struct{ *store.Store }

func (unavailableStore) VerifyToken(string, time.Time) (store.Token, error) {
	return store.Token{}, fmt.Errorf("%w: this gateway is fail-closed (--store-fail-closed)", store.ErrUnavailable)
}

// TestStoreUnavailable: a join a fail-closed gateway cannot check is a
// 503 with Retry-After and the reason, not an internal error, and not
// counted against the client (no 429 after many).
func TestStoreUnavailable(t *testing.T) {
	dir := t.TempDir()
	cert, pin, _, err := control.LoadOrCreateIdentity(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := control.NewServer(control.ServerConfig{Store: unavailableStore{st}, Backend: &controltest.Backend{}, Certificate: cert})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Shutdown(context.Background())
	c, err := control.NewClient(l.Addr().String(), pin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 2 * control.DefaultFailureBurst {
		_, err := c.Join(context.Background(), joinReq(store.TokenPrefix+"x"))
		var ae *control.APIError
		if !errors.Is(err, control.ErrStoreUnavailable) || !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable ||
			ae.RetryAfter != 10*time.Second || !strings.Contains(ae.Message, "fail-closed") {
			t.Fatalf("join %d at a fail-closed gateway without its database: got %v, want 503 store_unavailable with Retry-After 10 and the reason", i, err)
		}
	}
}
