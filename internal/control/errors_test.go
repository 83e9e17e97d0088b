// SPDX-License-Identifier: MIT

package control

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

// TestRefusalsRoundTrip answers every sentinel of the refusals table as
// the server does and reads it back as the client does: the client's error
// matches the sentinel (and no other), carries the row's status, and has a
// Retry-After exactly when the row has a wait; failures count against the
// source address.
func TestRefusalsRoundTrip(t *testing.T) {
	for _, r := range refusals {
		t.Run(r.code, func(t *testing.T) {
			s := NewServer(ServerConfig{})
			remote := netip.MustParseAddrPort("192.0.2.1:1234")
			rec := httptest.NewRecorder()
			s.refuse(rec, "test", remote, fmt.Errorf("%w: because", r.err))
			resp := rec.Result()
			ae := readAPIError(resp)
			if ae.Status != r.status {
				t.Errorf("status: got %d, want %d", ae.Status, r.status)
			}
			for _, o := range refusals {
				if got := errors.Is(ae, o.err); got != (o.err == r.err) {
					t.Errorf("errors.Is(%v, %v) = %v", ae, o.err, got)
				}
			}
			if got, want := ae.RetryAfter, r.wait.Round(time.Second); got != want {
				t.Errorf("Retry-After: got %v, want %v", got, want)
			}
			if ae.Message == "" {
				t.Error("no message")
			}
			if got := s.fails.size() == 1; got != r.failure {
				t.Errorf("counted as a failure: %v, want %v", got, r.failure)
			}
		})
	}
}

// TestRefusalRetryAfter: a refusal's own wait replaces its row's, rounded
// up to whole seconds; an error that wraps no sentinel is internal.
func TestRefusalRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code string
		want string
	}{
		{WithRetryAfter(fmt.Errorf("%w: over", ErrQuota), 2500*time.Millisecond), CodeQuota, "3"},
		{WithRetryAfter(ErrBusy, 10*time.Millisecond), CodeBusy, "1"},
		{fmt.Errorf("%w: full", ErrNoAddress), CodeNoAddress, ""},
		{errors.New("disk on fire"), CodeInternal, "5"},
	} {
		rec := httptest.NewRecorder()
		NewServer(ServerConfig{}).refuse(rec, "test", netip.AddrPort{}, tc.err)
		if got := rec.Header().Get("Retry-After"); got != tc.want {
			t.Errorf("%v: Retry-After %q, want %q", tc.err, got, tc.want)
		}
		if ae := readAPIError(rec.Result()); ae.Code != tc.code {
			t.Errorf("%v: code %q, want %q", tc.err, ae.Code, tc.code)
		}
		if tc.code == CodeInternal && rec.Code != http.StatusInternalServerError {
			t.Errorf("%v: status %d", tc.err, rec.Code)
		}
	}
}
