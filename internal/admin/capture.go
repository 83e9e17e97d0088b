// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/httpjson"
)

// CapturePath is the admin endpoint of a live capture: GET with the query
// job (batch job id, lease id or tunnel address), filter (capture.Filter
// syntax), snaplen and buffer (bytes); the answer is a pcap stream
// (application/vnd.tcpdump.pcap) until the client goes away or the job's
// lease ends.
const CapturePath = "/v1/capture"

// CaptureRequest is a live capture's parameters.
type CaptureRequest struct {
	Job    string
	Filter string
	// Snaplen and Buffer: 0 means the capture package's defaults.
	Snaplen, Buffer int
}

// ErrBadCapture is a live capture request the gateway cannot serve as
// asked.
var ErrBadCapture = errors.New("bad capture request")

// maxCaptureBuffer bounds a live capture's buffer.
const maxCaptureBuffer = 256 << 20

// handleCapture serves CapturePath with g.
func (s *Server) handleCapture(w http.ResponseWriter, r *http.Request, g Gateway) {
	q := r.URL.Query()
	req := CaptureRequest{Job: q.Get("job"), Filter: q.Get("filter")}
	bad := func(msg string) {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: msg})
	}
	for _, p := range []struct {
		name string
		dst  *int
	}{{"snaplen", &req.Snaplen}, {"buffer", &req.Buffer}} {
		if v := q.Get(p.name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				bad(fmt.Sprintf("capture: bad %s %q: want a number", p.name, v))
				return
			}
			*p.dst = n
		}
	}
	f, err := CheckCapture(req)
	if err != nil {
		bad(err.Error())
		return
	}
	var tap *capture.Tap
	var stop func()
	l, err := oneLease(g, req.Job, "capture")
	if errors.Is(err, ErrNoSuchJob) && s.relayCapture(w, r, req) {
		return // held by another gateway of the fleet
	}
	if err == nil {
		tap, stop, err = g.StartCapture([]string{l.ID}, req, f)
	}
	switch {
	case errors.Is(err, ErrNoSuchJob):
		httpjson.Write(w, http.StatusNotFound, errorBody{Code: codeNoSuchJob, Message: err.Error()})
		return
	case errors.Is(err, ErrAmbiguousJob):
		httpjson.Write(w, http.StatusConflict, errorBody{Code: codeAmbiguousJob, Message: err.Error()})
		return
	case errors.Is(err, ErrBadCapture):
		bad(err.Error())
		return
	case err != nil:
		httpjson.Write(w, http.StatusInternalServerError, errorBody{Code: codeInternal, Message: err.Error()})
		return
	}
	defer stop()
	start := time.Now()
	s.log.Info("live capture started", "job", req.Job, "filter", req.Filter)
	w.Header().Set("Content-Type", "application/vnd.tcpdump.pcap")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	err = tap.Serve(r.Context(), w, func() { _ = rc.Flush() })
	s.log.Info("live capture ended", "job", req.Job, "filter", req.Filter, "duration", time.Since(start).Round(time.Millisecond), "why", captureEnd(err))
}

// CheckCapture checks a live capture request as every gateway serves it
// (its own jobs' or relayed for the fleet): a job named, snaplen and
// buffer within bounds, a filter that parses. Errors wrap ErrBadCapture.
func CheckCapture(req CaptureRequest) (*capture.Filter, error) {
	if req.Job == "" || len(req.Job) > 128 {
		return nil, badCapture("capture: no job given; want a batch job id, lease id or tunnel address (airlock status lists them)")
	}
	for _, p := range []struct {
		name   string
		v, max int
	}{{"snaplen", req.Snaplen, capture.DefaultSnaplen}, {"buffer", req.Buffer, maxCaptureBuffer}} {
		if p.v < 0 || p.v > p.max {
			return nil, badCapture(fmt.Sprintf("capture: bad %s %d: want 0-%d", p.name, p.v, p.max))
		}
	}
	f, err := capture.ParseFilter(req.Filter)
	if err != nil {
		return nil, badCapture("capture: " + err.Error())
	}
	return f, nil
}

// badCapture is an error that says msg and is ErrBadCapture.
type badCapture string

func (e badCapture) Error() string        { return string(e) }
func (e badCapture) Is(target error) bool { return target == ErrBadCapture }

// captureEnd says why a live capture ended.
func captureEnd(err error) string {
	switch {
	case err == nil:
		return "the job's lease ended"
	case errors.Is(err, context.Canceled):
		return "the admin stopped it"
	}
	return err.Error()
}

// Capture starts a live capture and returns its pcap stream; closing it
// ends the capture. The error wraps ErrNoSuchJob if no live lease matches
// req.Job, ErrAmbiguousJob if it is a batch job id several claim.
func (c *Client) Capture(ctx context.Context, req CaptureRequest) (io.ReadCloser, error) {
	v := url.Values{"job": {req.Job}}
	if req.Filter != "" {
		v.Set("filter", req.Filter)
	}
	if req.Snaplen != 0 {
		v.Set("snaplen", strconv.Itoa(req.Snaplen))
	}
	if req.Buffer != 0 {
		v.Set("buffer", strconv.Itoa(req.Buffer))
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://airlock"+CapturePath+"?"+v.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("admin socket %s: %w", c.path, ErrNoGateway)
		}
		return nil, fmt.Errorf("admin socket %s: %w", c.path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("capture %s: %w", req.Job, responseError(http.MethodGet, CapturePath, resp))
	}
	return resp.Body, nil
}
