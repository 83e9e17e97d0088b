// SPDX-License-Identifier: MIT

package pgstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlock-vpn/airlock/internal/store"
)

// Capture tickets (migrations/002_captures.sql): how a live capture of a
// job that another gateway holds is relayed through the fleet.

// Capture is a relayed live capture as its ticket describes it.
type Capture struct {
	ID int64 `json:"-"`
	// Lease is the lease id of the job, Gateway the member id of the
	// gateway that holds it.
	Lease   string `json:"lease"`
	Gateway string `json:"gateway"`
	// Job is what the admin asked for (batch job id, lease id or tunnel
	// address), for the logs.
	Job     string `json:"job"`
	Filter  string `json:"filter,omitempty"`
	Snaplen int    `json:"snaplen,omitempty"`
	Buffer  int    `json:"buffer,omitempty"`
	// By says where the request was made (a gateway, or an admin host's
	// user and host as they claim them), for the holding gateway's log.
	By string `json:"by,omitempty"`
}

// RequestCapture stores a ticket for c that the holding gateway honours
// once, within ttl, for whoever presents the secret whose SHA-256 is
// secretHash; it returns the ticket's id. Tickets that expired a day ago
// go.
func (s *Store) RequestCapture(c Capture, secretHash []byte, ttl time.Duration) (int64, error) {
	rec, err := json.Marshal(c)
	if err != nil {
		return 0, err
	}
	ctx, cancel := s.call()
	defer cancel()
	var id int64
	err = s.pool.QueryRow(ctx, `insert into airlock_captures (lease_id, gateway, secret_hash, expires, record)
		values ($1, $2, $3, now() + $4 * interval '1 millisecond', $5) returning id`,
		c.Lease, c.Gateway, secretHash, ttl.Milliseconds(), rec).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("request capture: %w", denied(err, "write capture tickets"))
	}
	if _, err := s.pool.Exec(ctx, "delete from airlock_captures where expires < now() - interval '1 day'"); err != nil {
		return 0, fmt.Errorf("request capture: %w", err)
	}
	return id, nil
}

// TakeCapture takes ticket id for gateway gw if secretHash is its secret's
// and it is neither taken nor expired, and returns what it asks for. Any
// other ticket is store.ErrNotFound, whatever the reason (so that a
// guesser learns nothing).
func (s *Store) TakeCapture(id int64, gw string, secretHash []byte) (Capture, error) {
	ctx, cancel := s.call()
	defer cancel()
	var c Capture
	err := s.pool.QueryRow(ctx, `update airlock_captures set taken = now()
		where id = $1 and gateway = $2 and secret_hash = $3 and taken is null and expires > now()
		returning record`, id, gw, secretHash).Scan(&c)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, fmt.Errorf("capture ticket %d: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return c, fmt.Errorf("capture ticket %d: %w", id, err)
	}
	c.ID = id
	return c, nil
}
