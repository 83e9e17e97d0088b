// SPDX-License-Identifier: MIT

package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/airlock-vpn/airlock/internal/jointoken"
)

// Relayed live captures: in a fleet (internal/fleet), `airlock capture` of
// a job that another gateway holds reaches that gateway through its control
// API, the only port a gateway opens to the network. The request carries a
// capture ticket that the requester wrote into the fleet's database (the
// fleet's root of trust) with the SHA-256 of a secret only it knows; the
// gateway takes the ticket there, once and before it expires, and streams
// the capture it names. Without a valid ticket the endpoint answers 403
// and counts the failure against the source like a bad token, so it is no
// new way in: whoever can make a ticket can already write the database.
// The requester pins the gateway's key (its member record's pins), so the
// secret and the packets go only to that gateway and back.

// PathFleetCapture is the control API endpoint of relayed captures: POST
// a CaptureTicket; the answer is a pcap stream
// (application/vnd.tcpdump.pcap) until the job's lease ends or the
// requester goes away.
const PathFleetCapture = "/v1/fleet/capture"

// CaptureTicket names a capture ticket and proves the right to it.
type CaptureTicket struct {
	ID     int64  `json:"id"`
	Secret string `json:"secret"`
}

// maxTicketSecret bounds a ticket's secret (base64 of 32 bytes is 43).
const maxTicketSecret = 64

// The relay's refusals (rows of the refusals table, errors.go).
var (
	// ErrBadTicket means a capture ticket is unknown, taken, expired, for
	// another gateway, or its secret is wrong; it counts as a failed
	// attempt of the source, like a bad token.
	ErrBadTicket = errors.New("capture ticket refused: unknown, used, expired, for another gateway or a wrong secret")
	// ErrNoSuchCapture means a ticket's job is not live on this gateway
	// (any more), or its capture cannot be served as asked.
	ErrNoSuchCapture = errors.New("capture cannot be served here")
)

// CaptureRelay serves relayed captures on a gateway of a fleet.
type CaptureRelay interface {
	// OpenCapture takes ticket t (once) and starts the capture it names.
	// serve writes the pcap stream to w, calling flush after each write,
	// until ctx ends, the job's lease ends (nil) or a write fails; it
	// ends the capture when it returns. The error wraps ErrBadTicket or
	// ErrNoSuchCapture, or says why the ticket could not be checked.
	OpenCapture(t CaptureTicket) (serve func(ctx context.Context, w io.Writer, flush func()) error, err error)
}

// captureWriteTimeout bounds one write of a relayed capture: a requester
// that stops reading ends it (the job's packets are not held for it).
const captureWriteTimeout = 30 * time.Second

func (s *Server) handleFleetCapture(w http.ResponseWriter, r *http.Request) {
	remote := remoteAddr(r)
	if !s.admit(w, r, http.MethodPost, remote) {
		return
	}
	if s.relay == nil {
		writeError(w, http.StatusNotFound, CodeBadRequest, "this gateway relays no captures: it is not in a fleet")
		return
	}
	var t CaptureTicket
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodySize))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil || t.ID <= 0 || t.Secret == "" || len(t.Secret) > maxTicketSecret {
		s.refuse(w, "fleet capture", remote, fmt.Errorf("%w: invalid capture ticket", ErrBadRequest))
		return
	}
	serve, err := s.relay.OpenCapture(t)
	if err != nil {
		// ErrBadTicket, ErrNoSuchCapture, or the database's trouble.
		if errors.Is(err, jointoken.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		}
		s.refuse(w, "fleet capture", remote, err)
		return
	}
	s.log.Info("relayed capture: ticket taken", "ticket", t.ID, "remote", remote)
	rc := http.NewResponseController(w)
	// The capture outlives the server's read and write timeouts: each
	// write has a deadline of its own instead.
	rc.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	w.Header().Set("Content-Type", "application/vnd.tcpdump.pcap")
	w.WriteHeader(http.StatusOK)
	err = serve(ctx, deadlineWriter{w: w, rc: rc}, func() { _ = rc.Flush() })
	s.log.Debug("relayed capture ended", "ticket", t.ID, "remote", remote, "err", err)
}

// deadlineWriter gives every write to a streamed answer its own deadline.
type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (d deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(captureWriteTimeout))
	return d.w.Write(p)
}

// FleetCapture presents ticket t to the gateway and returns its pcap
// stream; closing it ends the capture. The answer's header must come
// within the client's timeout.
func (c *Client) FleetCapture(ctx context.Context, t CaptureTicket) (io.ReadCloser, error) {
	body, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("fleet capture: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+PathFleetCapture, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("fleet capture: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	// The transport bounds the wait for the answer's header
	// (ResponseHeaderTimeout); the stream itself has no deadline.
	resp, err := c.watchHTTP.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, "fleet capture", err, !isDialError(err))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, fmt.Errorf("fleet capture at %s: %w", c.gateway, readAPIError(resp))
	}
	return resp.Body, nil
}
