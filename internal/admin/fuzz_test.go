// SPDX-License-Identifier: MIT

package admin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/store"
)

// fuzzGateway knows one job, "4242".
type fuzzGateway struct{ kicked []string }

func (g *fuzzGateway) Status() Status { return Status{Mode: "user", Jobs: []JobStatus{}} }
func (g *fuzzGateway) Flows(f flows.Filter, activeOnly bool) FlowList {
	return FlowList{Active: []flows.Record{}}
}
func (g *fuzzGateway) Leases() []LiveLease {
	return []LiveLease{{ID: "l1", Addrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, JobID: "4242", Token: "other"}}
}
func (g *fuzzGateway) EndLease(id, by, reason, why string) (KickedLease, bool) {
	g.kicked = append(g.kicked, id)
	return KickedLease{Lease: id}, true
}
func (g *fuzzGateway) Ban(l LiveLease, d time.Duration, reason string) (time.Time, string) {
	return time.Now().Add(d), ""
}
func (g *fuzzGateway) SetDraining(on bool) bool { return false }
func (g *fuzzGateway) Reload() (ReloadResult, error) {
	return ReloadResult{}, errors.New("no config file")
}
func (g *fuzzGateway) StartCapture(ids []string, req CaptureRequest, f *capture.Filter) (*capture.Tap, func(), error) {
	return nil, nil, ErrBadCapture
}

// FuzzAdminRequest sends an arbitrary HTTP request (whatever net/http
// parses) to the admin API: tokens, whois, status, flows, kick.
// Invariants: no panic and no 500; our errors are JSON with a code; a
// token is created only by POST /v1/tokens and listed without its hash; a
// kick reaches the gateway only from POST /v1/kick with a job.
func FuzzAdminRequest(f *testing.F) {
	st, err := store.Open(filepath.Join(f.TempDir(), store.FileName), time.Second)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	if _, _, err := st.CreateToken("pilots", 0, time.Now()); err != nil {
		f.Fatal(err)
	}
	srv := NewServer(nil, st)
	g := &fuzzGateway{}
	srv.SetGateway(g)
	for _, s := range []string{
		"GET /v1/tokens HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /v1/tokens HTTP/1.1\r\nHost: a\r\nContent-Length: 28\r\n\r\n{\"name\":\"cms\",\"ttl\":\"720h\"}",
		"DELETE /v1/tokens/cms HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /v1/whois?addr=192.0.2.1&port=33012&at=2026-11-22T10:00:00Z HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /v1/status HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /v1/flows?job=4242&active=true HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /v1/kick HTTP/1.1\r\nHost: a\r\nContent-Length: 33\r\n\r\n{\"job\":\"4242\",\"reason\":\"abuse\"}",
		"POST /v1/drain HTTP/1.1\r\nHost: a\r\nContent-Length: 14\r\n\r\n{\"drain\":true}",
		"POST /v1/reload HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /v1/capture?job=4242&filter=tcp HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil || req.RequestURI == "*" {
			return // net/http's parser or server, not ours
		}
		body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		req.Body = io.NopCloser(bytes.NewReader(body))
		kicks := len(g.kicked)
		rec := httptest.NewRecorder()
		srv.mux.ServeHTTP(rec, req)
		route := req.Method + " " + req.URL.Path
		if rec.Code >= 500 {
			t.Fatalf("%s: status %d: %s", route, rec.Code, rec.Body.Bytes())
		}
		if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") && rec.Code >= 400 {
			var e errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" {
				t.Fatalf("%s: status %d with body %q", route, rec.Code, rec.Body.Bytes())
			}
		}
		if len(g.kicked) != kicks && route != "POST /v1/kick" {
			t.Fatalf("%s kicked a job", route)
		}
		if bytes.Contains(rec.Body.Bytes(), []byte(`"hash"`)) {
			t.Fatalf("%s: answer shows a token hash: %s", route, rec.Body.Bytes())
		}
		if rec.Code == http.StatusOK && route == "POST /v1/tokens" {
			var res createTokenResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || res.Secret == "" ||
				store.ValidateTokenName(res.Token.Name) != nil {
				t.Fatalf("created token %q: %v", rec.Body.Bytes(), err)
			}
			// Keep the store small: the next input starts from the same
			// tokens.
			if err := st.RevokeToken(res.Token.Name); err != nil {
				t.Fatal(err)
			}
		}
	})
}
