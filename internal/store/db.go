// SPDX-License-Identifier: MIT

package store

import (
	"fmt"
	"net/netip"
	"time"
)

// DB is the contract of the gateway's durable state: join tokens, bans,
// and the lease history that attributes outside connections to jobs. Two
// backends implement all of it: [Store], the embedded bbolt database of one
// gateway's state directory, and pgstore.Store, PostgreSQL shared by a fleet
// of gateways (and internal/fleet puts a local replica and journal in front
// of the latter, so that the database is not in the data path). The
// gateway, the control server and the admin API hold a DB and make no type
// assertions on it.
//
// Methods are safe for concurrent use. They block for at most the
// backend's own bound (a file lock, a database round trip with a timeout).
// Errors wrap the package's sentinels: [ErrNotFound], [ErrExists],
// [ErrInvalidName], [ErrBadToken] (and [ErrTokenExpired]).
type DB interface {
	// CreateToken makes a random token named name (generated if empty),
	// valid for ttl from now (0: never expires), stores its SHA-256 and
	// returns the clear token, which cannot be recovered later.
	CreateToken(name string, ttl time.Duration, now time.Time) (secret string, t Token, err error)
	// ImportToken stores an existing token (made by CreateToken
	// elsewhere) under name.
	ImportToken(name, secret string, ttl time.Duration, now time.Time) (Token, error)
	// Tokens returns every token, expired ones included, sorted by name.
	Tokens() ([]Token, error)
	// Token returns the named token's record without its hash, or an
	// error wrapping ErrNotFound if there is none (never made, or
	// revoked). The gateway checks a token again with it under its
	// admission lock and at every renewal.
	Token(name string) (Token, error)
	// RestrictToken sets the named token's restrictions (the networks its
	// joins may come from, whether they need a MUNGE credential) and
	// returns its record; an unknown name fails with ErrNotFound.
	RestrictToken(name string, r TokenRestrictions) (Token, error)
	// RevokeToken deletes the named token. Ending the leases granted with
	// it is the caller's business (the gateway's admin API, or, in a
	// fleet, every gateway on the database's notification).
	RevokeToken(name string) error
	// VerifyToken returns the token whose clear text is secret, unless it
	// is unknown, revoked or expired at now.
	VerifyToken(secret string, now time.Time) (Token, error)

	// AddBan stores b and returns it with its ID set.
	AddBan(b Ban) (Ban, error)
	// Bans returns the bans in force at now, oldest first.
	Bans(now time.Time) ([]Ban, error)

	// RecordLeaseStart adds r (with zero End) to the history.
	RecordLeaseStart(r LeaseRecord) error
	// RecordLeaseEnd sets the end time and reason of lease id, if it has
	// none yet; an unknown id fails with ErrNotFound.
	RecordLeaseEnd(id string, end time.Time, reason string) error
	// ActiveLeases returns this gateway's records that have no end yet,
	// oldest first: what a restart restores.
	ActiveLeases() ([]LeaseRecord, error)
	// Whois returns the leases whose port block (or own address) on addr
	// contained port at time at, newest first.
	Whois(addr netip.Addr, port uint16, at time.Time) ([]LeaseRecord, error)
	// PruneLeases deletes records that ended before cutoff and returns
	// how many it deleted.
	PruneLeases(cutoff time.Time) (int, error)

	// Close releases the backend.
	Close() error
}

var _ DB = (*Store)(nil)

// Ban refuses joins with a token from a host, or from a client address,
// until Until (airlock kick --ban). In a fleet it holds on every gateway.
type Ban struct {
	// ID is assigned by the store.
	ID    int64  `json:"id,omitempty"`
	Token string `json:"token"`
	// Host is the job's host name as its client claimed it; Addr the
	// client's address as the gateway saw it; UID, for a job whose
	// identity was attested, its attested uid, which the ban then
	// matches instead of host and address (a user cannot dodge it from
	// another node). At least one is set; the ban matches any.
	Host string     `json:"host,omitempty"`
	Addr netip.Addr `json:"addr,omitzero"`
	UID  *uint32    `json:"uid,omitempty"`
	// Issuer and Subject, for a job identified by an issuer-verified
	// bearer token, are its token's: the ban then matches them instead
	// of host and address (the subject cannot dodge it from another
	// node).
	Issuer  string `json:"issuer,omitempty"`
	Subject string `json:"subject,omitempty"`
	// Until is when the ban ends.
	Until  time.Time `json:"until"`
	Reason string    `json:"reason,omitempty"`
	// Created is when the ban was made, By who made it (the gateway's
	// advertised address and the command).
	Created time.Time `json:"created"`
	By      string    `json:"by,omitempty"`
}

// Valid reports whether b names what it bans: a token with a host or an
// address, or an attested uid (with the token, "" for joins without one).
func (b Ban) Valid() error {
	if (b.Issuer == "") != (b.Subject == "") {
		return fmt.Errorf("want both an issuer and a subject, or neither")
	}
	if b.UID == nil && b.Subject == "" && (b.Token == "" || b.Host == "" && !b.Addr.IsValid()) {
		return fmt.Errorf("want a token and a host or an address, an attested uid, or an issuer and subject")
	}
	return nil
}

// Attribution is one place a lease was seen outside: a public address with
// the lease's port block, or (Own) the job's own address with any port.
type Attribution struct {
	Addr   netip.Addr `json:"addr"`
	PortLo uint16     `json:"port_lo"`
	PortHi uint16     `json:"port_hi"`
	Own    bool       `json:"own,omitempty"`
}

// String shows a as ADDR:LO-HI, or ADDR (own) for a job's own address.
func (a Attribution) String() string {
	if a.Own {
		return a.Addr.String() + " (own)"
	}
	return fmt.Sprintf("%s:%d-%d", a.Addr, a.PortLo, a.PortHi)
}

// Attributions returns where r's flows left from, the keys whois finds it
// by: its egress entries (one per address family), each a public address
// with its port block or, with Own, the job's own address with any port
// (0-65535).
func Attributions(r LeaseRecord) []Attribution {
	out := make([]Attribution, 0, len(r.Egress))
	for _, a := range r.Egress {
		a.Addr = a.Addr.Unmap()
		if a.Own {
			a.PortLo, a.PortHi = 0, 65535
		}
		if a.Addr.IsValid() && a.PortLo <= a.PortHi {
			out = append(out, a)
		}
	}
	return out
}

// key returns a's key in the attribution index of the bbolt store: the
// address with the block's first port, or 0 for an own address.
func (a Attribution) key(r LeaseRecord) []byte {
	port := a.PortLo
	if a.Own {
		port = 0
	}
	return attrKey(a.Addr, port, r.Start, r.ID)
}

// Member is one gateway of a fleet as it registers itself in the shared
// database and heartbeats (internal/fleet).
type Member struct {
	// ID is the gateway's member id (Store.MemberID): made at its state
	// directory's first start in a fleet and kept across restarts and
	// TLS key rotations.
	ID string `json:"id"`
	// Pin is what clients must trust: the gateway's pin, or during a key
	// rotation its next and current pins separated by "|"
	// (control.ParsePins); it follows a rotation at the next heartbeat.
	Pin string `json:"pin,omitempty"`
	// Advertise is the HOST:PORT clients dial.
	Advertise string    `json:"advertise"`
	Version   string    `json:"version,omitempty"`
	Started   time.Time `json:"started"`
	Heartbeat time.Time `json:"heartbeat"`
	// Jobs is the number of live leases, Capacity how many the gateway
	// can hold.
	Jobs     int  `json:"jobs"`
	Capacity int  `json:"capacity"`
	Draining bool `json:"draining,omitempty"`
	// Stopped is set when the gateway stopped cleanly.
	Stopped bool `json:"stopped,omitempty"`
	// Sig enrols the member: the fleet key's signature of its ID,
	// Advertise and Pin (internal/fleet, enrol.go). Gateways hand clients
	// only members whose signature holds, so a row written with a
	// database password alone sends no job anywhere.
	Sig string `json:"sig,omitempty"`
}

// Alive reports whether m heartbeated within stale of now and has not
// stopped.
func (m Member) Alive(now time.Time, stale time.Duration) bool {
	return !m.Stopped && now.Sub(m.Heartbeat) < stale
}
