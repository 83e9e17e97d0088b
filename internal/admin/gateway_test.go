// SPDX-License-Identifier: MIT

package admin

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/flows"
)

// leaseGateway is a Gateway over a fixed list of leases that records
// what the admin API asked of it.
type leaseGateway struct {
	leases []LiveLease
	ended  []string
	banned []string
}

func (g *leaseGateway) Status() Status                    { return Status{} }
func (g *leaseGateway) Flows(flows.Filter, bool) FlowList { return FlowList{} }
func (g *leaseGateway) Leases() []LiveLease               { return g.leases }
func (g *leaseGateway) SetDraining(on bool) bool          { return false }
func (g *leaseGateway) Reload() (ReloadResult, error)     { return ReloadResult{}, nil }
func (g *leaseGateway) Ban(l LiveLease, d time.Duration, _ string) (time.Time, string) {
	g.banned = append(g.banned, l.ID)
	return time.Unix(0, 0).Add(d), "joins of " + l.Token
}
func (g *leaseGateway) EndLease(id, by, reason, why string) (KickedLease, bool) {
	g.ended = append(g.ended, id+" "+by+" "+why)
	return KickedLease{Lease: id}, true
}
func (g *leaseGateway) StartCapture([]string, CaptureRequest, *capture.Filter) (*capture.Tap, func(), error) {
	return nil, nil, ErrBadCapture
}

func TestKick(t *testing.T) {
	leases := []LiveLease{
		{ID: "a", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, JobID: "42", Host: "n1"},
		{ID: "b", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.3")}, JobID: "42", Host: "n2"},
		{ID: "c", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.4")}, JobID: "a"},
	}
	for _, tc := range []struct {
		name    string
		req     KickRequest
		ban     time.Duration
		err     error
		ended   string
		banned  bool
		message string
	}{
		{name: "lease-id", req: KickRequest{Job: "b", Reason: "abuse"}, ended: "b airlock kick kicked by admin: abuse"},
		{name: "address", req: KickRequest{Job: "100.64.0.4"}, ended: "c airlock kick kicked by admin"},
		// A batch job id comes from the client: it never shadows a lease id.
		{name: "lease-id-before-batch-id", req: KickRequest{Job: "a"}, ended: "a airlock kick kicked by admin"},
		{name: "ambiguous-batch-id", req: KickRequest{Job: "42"}, err: ErrAmbiguousJob, message: `lease a at 100.64.0.2 (host "n1"`},
		{name: "unknown", req: KickRequest{Job: "nosuch"}, err: ErrNoSuchJob, message: "airlock status lists them"},
		{name: "ban", req: KickRequest{Job: "c", Ban: "1h"}, ban: time.Hour, ended: "c airlock kick kicked by admin", banned: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &leaseGateway{leases: leases}
			res, err := kick(g, tc.req, tc.ban)
			if !errors.Is(err, tc.err) || (err != nil && !strings.Contains(err.Error(), tc.message)) {
				t.Fatalf("kick: got %v, want %v containing %q", err, tc.err, tc.message)
			}
			if tc.err != nil {
				if len(g.ended) != 0 {
					t.Errorf("ended: got %q, want none", g.ended)
				}
				return
			}
			if len(g.ended) != 1 || g.ended[0] != tc.ended {
				t.Errorf("ended: got %q, want [%q]", g.ended, tc.ended)
			}
			if got := len(g.banned) == 1; got != tc.banned {
				t.Errorf("banned: got %v, want %v", g.banned, tc.banned)
			}
			if tc.banned && !res.BannedUntil.Equal(time.Unix(0, 0).Add(tc.ban)) {
				t.Errorf("banned until: got %v, want the gateway's answer", res.BannedUntil)
			}
		})
	}
}

func TestEndTokenLeases(t *testing.T) {
	g := &leaseGateway{leases: []LiveLease{{ID: "a", Token: "cms"}, {ID: "b", Token: "atlas"}, {ID: "c", Token: "cms"}}}
	s := NewServer(nil, nil)
	got := s.endTokenLeases(g, "cms", "token cms revoked")
	if len(got) != 2 || got[0].Lease != "a" || got[1].Lease != "c" {
		t.Errorf("ended: got %+v, want leases a and c", got)
	}
	if want := "a airlock token revoke token cms revoked"; len(g.ended) != 2 || g.ended[0] != want {
		t.Errorf("EndLease calls: got %q, want first %q", g.ended, want)
	}
}

// captureGateway is a leaseGateway that records the leases a live capture
// was started for.
type captureGateway struct {
	leaseGateway
	captured [][]string
}

func (g *captureGateway) StartCapture(ids []string, _ CaptureRequest, _ *capture.Filter) (*capture.Tap, func(), error) {
	g.captured = append(g.captured, ids)
	return nil, nil, ErrBadCapture
}

// TestCaptureAmbiguous checks that a live capture names one job, as a
// kick does (issue 25, hole 8): a batch job id that several live leases
// claim is refused with the list, and nothing is captured; a lease id
// or address selects its one lease.
func TestCaptureAmbiguous(t *testing.T) {
	g := &captureGateway{leaseGateway: leaseGateway{leases: []LiveLease{
		{ID: "a", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, JobID: "42", Host: "n1"},
		{ID: "b", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.3")}, JobID: "42", Host: "n2"},
	}}}
	s := NewServer(nil, nil)
	w := httptest.NewRecorder()
	s.handleCapture(w, httptest.NewRequest(http.MethodGet, CapturePath+"?job=42", nil), g)
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), codeAmbiguousJob) || !strings.Contains(w.Body.String(), "lease b at 100.64.0.3") {
		t.Errorf("capture of a batch id two leases claim: %d %s, want 409 %s with the list", w.Code, w.Body.String(), codeAmbiguousJob)
	}
	if len(g.captured) != 0 {
		t.Errorf("capture of an ambiguous batch id started for %v, want nothing", g.captured)
	}
	w = httptest.NewRecorder()
	s.handleCapture(w, httptest.NewRequest(http.MethodGet, CapturePath+"?job=100.64.0.3", nil), g)
	if len(g.captured) != 1 || len(g.captured[0]) != 1 || g.captured[0][0] != "b" {
		t.Errorf("capture of 100.64.0.3 started for %v, want lease b", g.captured)
	}
}
