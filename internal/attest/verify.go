// SPDX-License-Identifier: MIT

package attest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/munge"
)

// By is the Attestation.By of MUNGE attestation.
const By = "munge"

// Origin policies of Verifier.Origin.
const (
	// OriginMatch requires a join to come from the address the node's
	// munged gives as its origin.
	OriginMatch = "match"
	// OriginAny takes joins from anywhere (nodes behind NAT): a
	// credential carried off its node then joins from wherever it is
	// taken, within its 60 s.
	OriginAny = "any"
)

// Verifier checks joins' MUNGE credentials for the gateway; it implements
// control.Attester. Its zero value is not usable: set Munge and Pin. It is
// safe for concurrent use.
type Verifier struct {
	// Munge is the gateway's munged, which shares the nodes' key.
	Munge munge.Client
	// Pin is this gateway's pin (sha256:HEX), or Pins, if set, returns
	// its pins now (a key rotation serves two): join credentials must
	// name one of them.
	Pin  string
	Pins func() []string
	// JobUIDs are the uids trusted to make job credentials; nil means
	// root only.
	JobUIDs []uint32
	// Origin is OriginMatch (the default when empty) or OriginAny.
	Origin string
	// LookupUser returns the gateway host's name for uid, "" if it has
	// none; nil means the host's passwd file (os/user).
	LookupUser func(uid uint32) string
	// Log, if set, gets a Debug line per verified join.
	Log *slog.Logger
	// Require makes every join need a credential (Required).
	Require bool
	// Holds, if set, keeps the job credentials of joins that were not
	// admitted for their retries (hold.go); nil: a job credential
	// decodes once, whatever became of its join.
	Holds *Holds
}

// Settle implements control.Attester: it spends the job credential of
// req, attested by Verify, if the join was admitted (err nil) or refused
// for good, and keeps it for the job's retry if the refusal clears with
// time.
func (v *Verifier) Settle(req control.JoinRequest, err error) {
	if req.Attest == nil || req.Attest.MungeJob == "" {
		return
	}
	v.Holds.settle(req.Attest.MungeJob, err != nil && control.Clears(err))
}

// Required implements control.Attester.
func (v *Verifier) Required() bool { return v.Require }

var _ control.Attester = (*Verifier)(nil)

// Verify implements control.Attester.
func (v *Verifier) Verify(ctx context.Context, req control.JoinRequest, remote netip.AddrPort) (*identity.Attestation, error) {
	if req.Attest == nil || req.Attest.Munge == "" {
		return nil, fmt.Errorf("%w: no credential", control.ErrAttestation)
	}
	cred, err := v.Munge.Decode(ctx, req.Attest.Munge)
	if err != nil {
		return nil, credError("the join's credential", cred, err)
	}
	p, err := ParseJoinPayload(cred.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: the join's credential is not an airlock join credential: %v", control.ErrAttestation, err)
	}
	if mine := v.pins(); !slices.ContainsFunc(p.Pins(), func(pin string) bool { return slices.Contains(mine, pin) }) {
		return nil, fmt.Errorf("%w: the join's credential was made for gateway %s, not this one (%s)", control.ErrAttestation, p.Gateway, strings.Join(mine, ", "))
	}
	if p.Key != req.PublicKey {
		return nil, fmt.Errorf("%w: the join's credential was made for WireGuard key %s, not the join's (%s)", control.ErrAttestation, p.Key, req.PublicKey)
	}
	from := remote.Addr().Unmap()
	if v.Origin != OriginAny {
		switch {
		case !cred.Origin.IsValid():
			return nil, fmt.Errorf("%w: the node's munged puts no origin address in its credentials, so the gateway cannot tell that the join comes from the node; start it with --origin=ADDRESS (the node's address as the gateway sees it), or set the gateway's attest origin to \"any\"", control.ErrAttestation)
		case cred.Origin != from:
			return nil, fmt.Errorf("%w: the credential was made on node %s but the join comes from %s; a credential is good only from the node that made it (behind NAT, set the gateway's attest origin to \"any\")", control.ErrAttestation, cred.Origin, from)
		}
	}
	if int64(req.Job.UID) != int64(cred.UID) {
		return nil, fmt.Errorf("%w: the join claims uid %d but its credential was made by uid %d", control.ErrAttestation, req.Job.UID, cred.UID)
	}
	name := v.lookup(cred.UID)
	if name != "" && req.Job.User != "" && req.Job.User != name {
		return nil, fmt.Errorf("%w: the join claims user %q but uid %d is %q on the gateway", control.ErrAttestation, req.Job.User, cred.UID, name)
	}
	a := &identity.Attestation{By: By, UID: cred.UID, GID: cred.GID, User: name, Node: cred.Origin, Made: cred.Encoded}
	switch {
	case req.Attest.MungeJob == "" && p.JobCred != "":
		return nil, fmt.Errorf("%w: the join's credential names a job credential the join does not carry", control.ErrAttestation)
	case req.Attest.MungeJob != "" && p.JobCred != JobCredHash(req.Attest.MungeJob):
		return nil, fmt.Errorf("%w: the join carries a job credential its own credential does not name (each job credential is bound to the join credential made with it)", control.ErrAttestation)
	case req.Attest.MungeJob != "":
		j, err := v.job(ctx, req, cred)
		if err != nil {
			return nil, err
		}
		a.Job = j
	}
	if v.Log != nil {
		v.Log.Debug("join attested", "attested", a.String(), "remote", remote)
	}
	return a, nil
}

// job checks the job credential of req, whose join credential is user.
// A job credential that decodes (or is held, hold.go) is in use by this
// join until Settle; a check of it that fails spends it.
func (v *Verifier) job(ctx context.Context, req control.JoinRequest, user munge.Credential) (_ *identity.AttestedJob, err error) {
	text := req.Attest.MungeJob
	jc, ok, busy := v.Holds.take(text)
	switch {
	case busy:
		return nil, fmt.Errorf("%w: the job credential is being used by another join right now: each job credential admits one join (a copy of this job's credential?)", control.ErrAttestation)
	case !ok:
		jc, err = v.Munge.Decode(ctx, text)
		if err != nil {
			return nil, credError("the job credential", jc, err)
		}
	}
	defer func() {
		if err != nil {
			v.Holds.settle(text, false)
		}
	}()
	trusted := v.JobUIDs
	if trusted == nil {
		trusted = []uint32{0}
	}
	if !slices.Contains(trusted, jc.UID) {
		return nil, fmt.Errorf("%w: the job credential was made by uid %d, which this gateway does not trust to vouch for jobs (it trusts uid %v: root in slurmstepd, Airlock's SPANK plugin)", control.ErrAttestation, jc.UID, trusted)
	}
	jp, err := ParseJobPayload(jc.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: the job credential is not an airlock job credential: %v", control.ErrAttestation, err)
	}
	if !ok {
		// A job credential root made: held for this join's retry.
		v.Holds.put(text, jc)
	}
	if jc.Origin != user.Origin {
		return nil, fmt.Errorf("%w: the job credential was made on node %s, the join's on %s", control.ErrAttestation, jc.Origin, user.Origin)
	}
	if jp.UID != user.UID {
		return nil, fmt.Errorf("%w: the job credential is for a job of uid %d, the join's credential was made by uid %d", control.ErrAttestation, jp.UID, user.UID)
	}
	if c := req.Job.BatchJobID; c != "" && c != jp.JobID {
		return nil, fmt.Errorf("%w: the join claims batch job %q but its job credential is for job %q", control.ErrAttestation, c, jp.JobID)
	}
	if c := req.Job.BatchSystem; c != "" && c != jp.Batch {
		return nil, fmt.Errorf("%w: the join claims batch system %q but its job credential is from %q", control.ErrAttestation, c, jp.Batch)
	}
	return &identity.AttestedJob{MadeBy: jc.UID, BatchSystem: jp.Batch, JobID: jp.JobID, Step: jp.Step, Node: jp.Node}, nil
}

// credError explains why munged refused a credential (what is which), or
// passes on the gateway's own failure to reach its munged.
func credError(what string, c munge.Credential, err error) error {
	if !munge.IsBadCredential(err) {
		// The gateway's munged fails or is slow: a 503 the job waits
		// out, counted against its source, logged rate-limited.
		return fmt.Errorf("%w: check %s with the gateway's munged: %w", control.ErrAttestationUnavailable, what, err)
	}
	var why string
	switch {
	case errors.Is(err, munge.ErrReplayed):
		why = "was used before: this gateway's munged decodes each credential once, and every airlock run makes a new one, so another process presented this one first (a copy of this job's credential?)"
	case errors.Is(err, munge.ErrExpired):
		why = fmt.Sprintf("expired: made %s by the node's clock, for %s; check that the node's and the gateway's clocks agree", c.Encoded.UTC().Format(time.RFC3339), c.TTL)
	case errors.Is(err, munge.ErrRewound):
		why = fmt.Sprintf("was made in the future by the gateway's clock (%s): the node's and the gateway's clocks disagree; check NTP", c.Encoded.UTC().Format(time.RFC3339))
	case errors.Is(err, munge.ErrUnauthorized):
		why = "may be decoded only by another uid"
	default:
		why = "does not decode with the gateway's MUNGE key: the node's munged and the gateway's must share a key (the dedicated node+gateway key, docs/security.md)"
	}
	return fmt.Errorf("%w: %s %s (munge: %v)", control.ErrAttestation, what, why, err)
}

func (v *Verifier) pins() []string {
	if v.Pins != nil {
		return v.Pins()
	}
	return []string{v.Pin}
}

func (v *Verifier) lookup(uid uint32) string {
	if v.LookupUser != nil {
		return v.LookupUser(uid)
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return ""
	}
	return u.Username
}
