// SPDX-License-Identifier: MIT

package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/store"
	"golang.org/x/time/rate"
)

// fuzzToken is the one valid join token of the fuzzed server, and
// fuzzLease the one lease its backend grants.
const fuzzToken = "alk1_AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA"

var fuzzLease = LeaseRef{ID: "lease-1", Secret: "c2VjcmV0LW9mLWxlYXNlLTE"}

// fuzzBackend grants fuzzLease to every join and knows no other lease. It
// serves tunnels (attach closes the connection) and watches.
type fuzzBackend struct{}

func (fuzzBackend) Join(ctx context.Context, req JoinRequest, tok store.Token, remote netip.AddrPort) (Lease, error) {
	gw := netip.MustParseAddr("100.64.0.1")
	return Lease{ID: fuzzLease.ID, Secret: fuzzLease.Secret, Addresses: []netip.Prefix{netip.MustParsePrefix("100.64.0.2/16")},
		Gateways: []netip.Addr{gw}, DNS: []netip.Addr{gw}, MTU: 1420, GatewayPublicKey: testKeyValue,
		Endpoint: "192.0.2.1:8443", RenewInterval: Duration(time.Minute), Expires: time.Unix(1e9, 0).UTC()}, nil
}

func (fuzzBackend) check(ref LeaseRef) error {
	if ref != fuzzLease {
		return ErrUnknownLease
	}
	return nil
}

func (b fuzzBackend) Renew(ctx context.Context, ref LeaseRef) (RenewResponse, error) {
	return RenewResponse{Expires: time.Unix(1e9, 0).UTC()}, b.check(ref)
}

func (b fuzzBackend) Release(ctx context.Context, ref LeaseRef) error { return b.check(ref) }
func (fuzzBackend) Health() Health                                    { return Health{Instance: "fuzz"} }
func (b fuzzBackend) CheckLease(ref LeaseRef) error                   { return b.check(ref) }
func (fuzzBackend) ReportBypass(LeaseRef, []BypassCount)              {}
func (fuzzBackend) Reidentify(LeaseRef, *identity.Issued) error       { return nil }
func (fuzzBackend) HandshakeDue(LeaseRef) time.Duration               { return 0 }
func (b fuzzBackend) LeaseBypass(ref LeaseRef) (*Bypass, <-chan struct{}, error) {
	return nil, nil, ErrNotSupported
}

func (b fuzzBackend) Tunnel(ctx context.Context, ref LeaseRef, remote netip.AddrPort) (func(net.Conn), error) {
	if err := b.check(ref); err != nil {
		return nil, err
	}
	return func(c net.Conn) { c.Close() }, nil
}

// hijackRecorder is an httptest.ResponseRecorder that can be hijacked (for
// the tunnel upgrade): the connection is one end of a pipe whose other end
// is read into upgraded.
type hijackRecorder struct {
	*httptest.ResponseRecorder
	hijacked bool
	upgraded bytes.Buffer
	done     chan struct{}
}

func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	a, b := net.Pipe()
	h.hijacked = true
	h.done = make(chan struct{})
	go func() {
		defer close(h.done)
		defer b.Close()
		// Until EOF (a tunnel's attach closes it), or the first line
		// after the 101's header (a session's first event).
		buf := make([]byte, 4096)
		for h.upgraded.Len() < 1<<16 {
			n, err := b.Read(buf)
			h.upgraded.Write(buf[:n])
			if _, rest, ok := bytes.Cut(h.upgraded.Bytes(), []byte("\r\n\r\n")); ok && bytes.IndexByte(rest, '\n') >= 0 {
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return a, bufio.NewReadWriter(bufio.NewReader(a), bufio.NewWriter(a)), nil
}

// FuzzControlRequest sends an arbitrary HTTP request (whatever the net/http
// parser accepts: any method, path, headers and body) to the control API's
// handler, with one valid token and one live lease. Invariants: no panic,
// no 500; every error is a JSON ErrorResponse with a code; a join succeeds
// only with the valid token and a valid key; renew, release, watch and the
// tunnel upgrade succeed only for the live lease's id and secret, and the
// tunnel only with the Upgrade handshake.
func FuzzControlRequest(f *testing.F) {
	st, err := store.Open(filepath.Join(f.TempDir(), store.FileName), time.Second)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	if _, err := st.ImportToken("fuzz", fuzzToken, 0, time.Now()); err != nil {
		f.Fatal(err)
	}
	srv := NewServer(ServerConfig{Store: st, Backend: fuzzBackend{}, FailureLimit: rate.Inf, WatchHeartbeat: time.Hour})
	lease, _ := json.Marshal(fuzzLease)
	for _, s := range []string{
		"POST " + PathJoin + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\r\n" +
			`{"token":"` + fuzzToken + `","public_key":"` + testKey + `","job":{"batch_job_id":"42","uid":1000}}`,
		"POST " + PathRenew + " HTTP/1.1\r\nHost: gw\r\n\r\n" + string(lease),
		"POST " + PathRelease + " HTTP/1.1\r\nHost: gw\r\n\r\n" + string(lease),
		"POST " + PathWatch + " HTTP/1.1\r\nHost: gw\r\n\r\n" + string(lease),
		"GET " + PathTunnel + " HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: " + TunnelProtocol +
			"\r\n" + HeaderLeaseID + ": " + fuzzLease.ID + "\r\n" + HeaderLeaseSecret + ": " + fuzzLease.Secret + "\r\n\r\n",
		"GET " + PathSession + " HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: " + SessionProtocol +
			"\r\n" + HeaderLeaseID + ": " + fuzzLease.ID + "\r\n" + HeaderLeaseSecret + ": " + fuzzLease.Secret + "\r\n\r\n",
		"GET " + PathHealth + " HTTP/1.1\r\nHost: gw\r\n\r\n",
		"POST " + PathRenew + " HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return // net/http's parser, not ours
		}
		if req.RequestURI == "*" {
			return // answered by ServeMux (400) or http.Server, not ours
		}
		body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.RemoteAddr = "192.0.2.7:40000"
		// A watch that succeeds streams until its request ends: end it
		// after the first event.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req = req.WithContext(ctx)
		rec := &hijackRecorder{ResponseRecorder: httptest.NewRecorder()}
		srv.http.Handler.ServeHTTP(rec, req)
		if rec.hijacked {
			<-rec.done
			if req.URL.Path != PathTunnel && req.URL.Path != PathSession {
				t.Fatalf("%s hijacked the connection", req.URL.Path)
			}
			if req.Header.Get(HeaderLeaseID) != fuzzLease.ID || req.Header.Get(HeaderLeaseSecret) != fuzzLease.Secret {
				t.Fatalf("%s upgraded for lease %q", req.URL.Path, req.Header.Get(HeaderLeaseID))
			}
			if !strings.HasPrefix(rec.upgraded.String(), "HTTP/1.1 101 ") {
				t.Fatalf("%s upgrade answered %q", req.URL.Path, rec.upgraded.String())
			}
			return
		}
		code := rec.Code
		switch {
		case code >= 500 && code != http.StatusServiceUnavailable:
			t.Fatalf("%s %s: status %d: %s", req.Method, req.URL.Path, code, rec.Body.Bytes())
		case code == http.StatusMovedPermanently || code == http.StatusTemporaryRedirect || code == http.StatusPermanentRedirect:
			return // ServeMux cleaning the path (/./v1/join → /v1/join): no handler ran
		case code >= 300:
			var e ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" || !utf8.ValidString(e.Message) {
				t.Fatalf("%s %s: status %d with body %q, want an ErrorResponse", req.Method, req.URL.Path, code, rec.Body.Bytes())
			}
			return
		}
		// Success: only what was really authorised.
		switch req.URL.Path {
		case PathJoin:
			jr, err := decodeJoinRequest(bytes.NewReader(body))
			if err != nil || jr.Token != fuzzToken {
				t.Fatalf("join answered %d for %q (%v)", code, body, err)
			}
			var l Lease
			if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil || l.ID != fuzzLease.ID {
				t.Fatalf("join answered %q", rec.Body.Bytes())
			}
		case PathRenew, PathRelease, PathWatch:
			ref, err := decodeLeaseRef(bytes.NewReader(body))
			if err != nil || ref != fuzzLease {
				t.Fatalf("%s answered %d for %q (%v)", req.URL.Path, code, body, err)
			}
		case PathHealth:
			if req.Method != http.MethodGet && req.Method != http.MethodHead {
				t.Fatalf("health answered %d to %s", code, req.Method)
			}
		default:
			t.Fatalf("%s %s answered %d", req.Method, req.URL.Path, code)
		}
	})
}

// FuzzDecodeSessionRequest feeds arbitrary lines to the decoder of a
// lease session's requests. Invariants: an accepted line has a known op,
// bypass counters only with a renewal and valid ones, and encodes back to
// an equivalent request.
func FuzzDecodeSessionRequest(f *testing.F) {
	f.Add([]byte(`{"id":1,"op":"renew"}`))
	f.Add([]byte(`{"id":2,"op":"renew","bypass":[{"rule":"cvmfs","flows":3,"bytes_out":10,"bytes_in":20}]}`))
	f.Add([]byte(`{"id":3,"op":"release"}`))
	f.Add([]byte(`{"id":4,"op":"release","bypass":[{"rule":"x"}]}`))
	f.Add([]byte(`{"id":-1,"op":"renew"}`))
	f.Add([]byte(`{"id":5,"op":"renew","x":1}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := decodeSessionRequest(line)
		if err != nil {
			return
		}
		if req.Op != OpRenew && req.Op != OpRelease {
			t.Fatalf("accepted op %q", req.Op)
		}
		if req.Op == OpRelease && len(req.Bypass) > 0 {
			t.Fatalf("accepted bypass counters with a release")
		}
		if err := checkBypassCounts(req.Bypass); err != nil {
			t.Fatalf("accepted bad counters: %v", err)
		}
		back, err := decodeSessionRequest(marshalLine(req))
		if err != nil || back.ID != req.ID || back.Op != req.Op || len(back.Bypass) != len(req.Bypass) {
			t.Fatalf("round trip of %+v: %+v, %v", req, back, err)
		}
	})
}

// FuzzDecodeLeaseRef feeds arbitrary bodies to the decoder of renew,
// release and watch requests. Invariants: an accepted body names a lease
// id and secret, and encodes back to an equivalent object.
func FuzzDecodeLeaseRef(f *testing.F) {
	f.Add([]byte(`{"id":"lease-1","secret":"abc"}`))
	f.Add([]byte(`{"id":"","secret":"abc"}`))
	f.Add([]byte(`{"id":"a","secret":"b","x":1}`))
	f.Add([]byte(`{"id":"a","secret":"b"} []`))
	f.Add([]byte(`{"id":"\u0000","secret":"\ud800"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		ref, err := decodeLeaseRef(bytes.NewReader(body))
		if err != nil {
			if ref != (LeaseRef{}) {
				t.Fatalf("error %v with a non-zero ref %+v", err, ref)
			}
			return
		}
		if ref.ID == "" || ref.Secret == "" {
			t.Fatalf("accepted %q without id or secret", body)
		}
		again, err := json.Marshal(ref)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decodeLeaseRef(bytes.NewReader(again))
		if err != nil || back != ref {
			t.Fatalf("round trip of %+v: %+v, %v", ref, back, err)
		}
	})
}
