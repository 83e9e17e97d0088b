// SPDX-License-Identifier: MIT

package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

// Live captures of a job that another gateway holds, relayed through the
// fleet (control/relay.go has the protocol): the requester finds the
// holder as a kick does, writes a capture ticket with the SHA-256 of a
// fresh secret into the database, and presents the secret to the holder's
// control API, pinned to the holder's key; the holder takes the ticket
// (once, within CaptureTicketTTL) and streams the capture.

// CaptureTicketTTL is how long a capture ticket may wait for the
// requester to present it.
const CaptureTicketTTL = 30 * time.Second

// CaptureRequest is a live capture asked of the fleet, with the selection
// and limits of a local one (admin.CaptureRequest).
type CaptureRequest struct {
	Job, Filter     string
	Snaplen, Buffer int
	// By says who asks, for the holding gateway's log.
	By string
}

// ErrCaptureUnreachable means the gateway that holds the job cannot be
// reached from here; the error says where to run the capture instead.
var ErrCaptureUnreachable = errors.New("cannot reach the gateway that holds the job")

// Capture relays a live capture of req.Job from the fleet's gateway that
// holds it and returns the pcap stream (close it to end the capture), the
// job's lease and its gateway. timeout bounds the connection to the
// gateway and the wait for its answer. Errors: ErrNoSuchJob and
// ErrAmbiguousJob as FindLease; ErrCaptureUnreachable; the holder's refusal.
func Capture(ctx context.Context, db *pgstore.Store, req CaptureRequest, timeout time.Duration) (io.ReadCloser, store.LeaseRecord, store.Member, error) {
	r, err := FindLease(db, req.Job)
	if err != nil {
		return nil, r, store.Member{}, err
	}
	gw, err := holder(db, r)
	if err != nil {
		return nil, r, gw, err
	}
	now, err := db.Now()
	if err != nil {
		return nil, r, gw, err
	}
	if !gw.Alive(now, MemberStale) {
		return nil, r, gw, fmt.Errorf("%w: gateway %s, which holds lease %s, has not heartbeated for %v (stopped or lost): its jobs fail over to the other gateways, where a capture finds them",
			ErrCaptureUnreachable, gw.Advertise, r.ID, now.Sub(gw.Heartbeat).Round(time.Second))
	}
	pin := gw.Pin
	if pin == "" {
		pin = gw.ID // a member record of before member ids: its id was its pin
	}
	cc, err := control.NewClient(gw.Advertise, pin, timeout)
	if err != nil {
		return nil, r, gw, fmt.Errorf("gateway %s: %w", gw.Advertise, err)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, r, gw, err
	}
	secret := base64.RawURLEncoding.EncodeToString(b[:])
	hash := sha256.Sum256([]byte(secret))
	id, err := db.RequestCapture(pgstore.Capture{Lease: r.ID, Gateway: gw.ID, Job: req.Job, Filter: req.Filter,
		Snaplen: req.Snaplen, Buffer: req.Buffer, By: req.By}, hash[:], CaptureTicketTTL)
	if err != nil {
		return nil, r, gw, err
	}
	body, err := cc.FleetCapture(ctx, control.CaptureTicket{ID: id, Secret: secret})
	if errors.Is(err, control.ErrUnreachable) {
		return nil, r, gw, fmt.Errorf("%w: gateway %s (it holds lease %s): %w; run airlock capture on that gateway's host (--state), or from a host that reaches its control port",
			ErrCaptureUnreachable, gw.Advertise, r.ID, err)
	}
	if err != nil {
		return nil, r, gw, err
	}
	return body, r, gw, nil
}

// TakeCapture takes capture ticket t for this gateway from the database.
// The error wraps control.ErrBadTicket for a ticket this gateway must not
// serve, ErrUnavailable when the database cannot say.
func (n *Node) TakeCapture(t control.CaptureTicket) (pgstore.Capture, error) {
	hash := sha256.Sum256([]byte(t.Secret))
	c, err := n.remote.TakeCapture(t.ID, n.cfg.Self.ID, hash[:])
	if errors.Is(err, store.ErrNotFound) {
		return c, fmt.Errorf("%w: ticket %d", control.ErrBadTicket, t.ID)
	}
	return c, unavailable(err)
}

// Capture relays a live capture of req.Job from the fleet's gateway that
// holds it, as this gateway's admin asked (Capture, By naming this
// gateway).
func (n *Node) Capture(ctx context.Context, req CaptureRequest, timeout time.Duration) (io.ReadCloser, store.LeaseRecord, store.Member, error) {
	req.By = fmt.Sprintf("airlock capture on gateway %s (member %s)", n.cfg.Self.Advertise, n.cfg.Self.ID)
	return Capture(ctx, n.remote, req, timeout)
}
