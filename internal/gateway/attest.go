// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/attest"
	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/munge"
)

// Attested identity at the gateway: the control server asks
// g.attest (a control.Attester) to verify the MUNGE credentials of every
// join (internal/attest); what it returns is the job's attested identity,
// kept next to what the client claimed in the lease (owner.Attested), the
// lease history (store.LeaseRecord.Attested), the flow table's and the
// captures' job references, status, whois and the metrics. The settings
// come from --attest and its flags, or from the config file's [attest],
// and a reload may change them.

// attestation is the gateway's control.Attester: the verifier of the
// settings in force (nil: off). Safe for concurrent use; the zero value
// is off.
type attestation struct {
	v atomic.Pointer[attest.Verifier]
	// holds are the job credentials held for joins' retries, shared by
	// the verifiers of every reload.
	holds attest.Holds
}

var _ control.Attester = (*attestation)(nil)

// Verify implements control.Attester.
func (a *attestation) Verify(ctx context.Context, req control.JoinRequest, remote netip.AddrPort) (*identity.Attestation, error) {
	v := a.v.Load()
	if v == nil {
		return nil, nil
	}
	return v.Verify(ctx, req, remote)
}

// Settle implements control.Attester.
func (a *attestation) Settle(req control.JoinRequest, err error) {
	// The verifier in force, or the one that attested req (a reload
	// may have replaced it): they share holds.
	(&attest.Verifier{Holds: &a.holds}).Settle(req, err)
}

// Required implements control.Attester.
func (a *attestation) Required() bool {
	v := a.v.Load()
	return v != nil && v.Require
}

// mode is what the gateway's health report says: attest.By, or "".
func (a *attestation) mode() string {
	if a.v.Load() != nil {
		return attest.By
	}
	return ""
}

// mungeTimeout bounds one exchange with the gateway's munged, which
// answers in a millisecond when well: a join whose credential it cannot
// check in time is answered 503 with a Retry-After
// (control.ErrAttestationUnavailable), not held.
const mungeTimeout = 2 * time.Second

// applyAttest puts the attestation settings c in force. Before it does,
// it checks that the gateway's munged answers (a credential of its own
// made and decoded), so that a wrong socket is an error at start or
// reload, not a refusal of every job.
func (a *admission) applyAttest(c config.Attest) error {
	if c.Mode == "" || c.Mode == config.AttestOff {
		if a.attest.v.Swap(nil) != nil {
			a.g.log.Warn("attested identity off: joins need a token, and what jobs say about themselves is only claimed")
		}
		return nil
	}
	v := &attest.Verifier{
		Munge:   munge.Client{Socket: c.Socket, Timeout: mungeTimeout},
		Pin:     a.g.res.info.Fingerprint,
		Pins:    a.currentPins,
		JobUIDs: c.JobUIDs,
		Origin:  c.Origin,
		Require: c.Required,
		Holds:   &a.attest.holds,
		Log:     a.g.log.With("component", "attest"),
	}
	if err := probeMunge(v.Munge); err != nil {
		return err
	}
	a.attest.v.Store(v)
	socket := c.Socket
	if socket == "" {
		socket = munge.DefaultSocket
	}
	trusted := c.JobUIDs
	if trusted == nil {
		trusted = []uint32{0}
	}
	origin := c.Origin
	if origin == "" {
		origin = attest.OriginMatch
	}
	a.g.log.Info("attested identity: joins' MUNGE credentials are checked with the gateway's munged", "socket", socket,
		"required", c.Required, "job_credentials_from_uids", trusted, "origin", origin)
	return nil
}

// probeMunge checks that munged at m answers: it encodes and decodes a
// credential.
func probeMunge(m munge.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	socket := m.Socket
	if socket == "" {
		socket = munge.DefaultSocket
	}
	cred, err := m.Encode(ctx, []byte("airlock-probe"), munge.EncodeOptions{TTL: 10})
	if err == nil {
		_, err = m.Decode(ctx, cred)
	}
	if err != nil {
		return fmt.Errorf("attested identity (--attest munge): the gateway's munged at %s does not answer: %w; start it (with the key the nodes' munged share with the gateway, docs/security.md) or name its socket (--munge-socket, [attest] socket)", socket, err)
	}
	return nil
}

// inherit returns the attestation of a join that replaces lease old (it
// proved it holds it): what the join's own credential attests, and, if it
// carries no job credential of its own, the job old's was attested for —
// the same uid on the same node rejoining (the job credential is spent at
// the first join).
func inherit(now *identity.Attestation, old *identity.Attestation) *identity.Attestation {
	if now == nil || now.Job != nil || old == nil || old.Job == nil || old.UID != now.UID || old.Node != now.Node {
		return now
	}
	a := *now
	j := *old.Job
	j.Inherited = true
	a.Job = &j
	return &a
}

// refOf returns the flow table's view of a's identity.
func refOf(a *identity.Attestation) (by string, uid *uint32, job bool) {
	if a == nil {
		return "", nil, false
	}
	u := a.UID
	return a.By, &u, a.Job != nil
}

// currentPins are the pins of the TLS identities the gateway presents now
// (two during a key rotation).
func (a *admission) currentPins() []string {
	if a.g.res.ids == nil {
		return []string{a.g.res.info.Fingerprint}
	}
	cur, next := a.g.res.ids.Pins()
	if next == "" {
		return []string{cur}
	}
	return []string{cur, next}
}
