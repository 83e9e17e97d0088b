// SPDX-License-Identifier: MIT

package control

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/airlock-vpn/airlock/internal/identity"
)

// Attested identity on the wire. A join may carry MUNGE credentials
// (internal/attest says what their payloads bind): the one the joining
// process made on the node, which gives the gateway its uid, gid and node,
// and one root made for the job (Airlock's SPANK plugin in slurmstepd),
// which gives it the batch job id. The control server has an [Attester]
// verify them before the join reaches the Backend, which then finds the
// result in JoinRequest.Attested: claimed and attested values never share
// a field.

// Attest carries a join's MUNGE credentials.
type Attest struct {
	// Munge is the credential the joining process made ("MUNGE:...:").
	Munge string `json:"munge"`
	// MungeJob is the job credential root made on the node, if any.
	MungeJob string `json:"munge_job,omitempty"`
}

// maxCredential bounds a credential's text: MUNGE credentials of
// Airlock's payloads are about 250 bytes.
const maxCredential = 4096

// validate checks a's shape (the Attester checks the rest).
func (a *Attest) validate() error {
	for _, f := range []struct {
		name string
		v    string
		need bool
	}{{"attest.munge", a.Munge, true}, {"attest.munge_job", a.MungeJob, false}} {
		switch {
		case f.v == "" && f.need:
			return fmt.Errorf("%s: missing credential", f.name)
		case f.v == "":
		case len(f.v) > maxCredential:
			return fmt.Errorf("%s: %d bytes, longer than the limit of %d", f.name, len(f.v), maxCredential)
		case !strings.HasPrefix(f.v, "MUNGE:") || !strings.HasSuffix(f.v, ":") || !printableASCII(f.v):
			return fmt.Errorf("%s: not a MUNGE credential (want MUNGE:...:)", f.name)
		}
	}
	return nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// Attester verifies the credentials of joins (internal/attest is the
// gateway's). Verify is called concurrently, once per join that carries
// credentials, before the join reaches the Backend.
type Attester interface {
	// Verify checks req.Attest for a join from remote and returns what
	// it attests. Errors wrap ErrAttestation with a sentence for the
	// user when the credentials do not prove what the join claims (a
	// bad, replayed or expired credential, another uid, another node);
	// other errors are the gateway's own (its munged is down). (nil, nil)
	// means the gateway does not check credentials now (a reload turned
	// attestation off): the join is taken as unattested.
	Verify(ctx context.Context, req JoinRequest, remote netip.AddrPort) (*identity.Attestation, error)
	// Required reports whether every join must carry a valid credential
	// (site-wide); a token can require one for its own joins.
	Required() bool
	// Settle tells the Attester what became of a join whose credentials
	// Verify attested: admitted (err nil) or refused with err. A
	// credential of a join refused for a reason that clears with time
	// ([Clears]) must stay good for the job's retry: root made the job
	// credential once. Called once per successful Verify.
	Settle(req JoinRequest, err error)
}

// Errors of attested joins.
var (
	// ErrAttestation means a join's credential was refused; the message
	// says why and what to do.
	ErrAttestation = errors.New("attestation refused")
	// ErrAttestationRequired means the gateway (or the join's token)
	// requires a MUNGE credential and the join had none.
	ErrAttestationRequired = errors.New("attestation required")
	// ErrAttestationUnavailable means the gateway cannot check MUNGE
	// credentials now: its munged fails or is slow. The join may be
	// retried; it counts against its source like a failure, so that a
	// flood of credentials cannot keep the gateway's munged busy.
	ErrAttestationUnavailable = errors.New("gateway cannot check MUNGE credentials now")
)

// Codes of those errors in [ErrorResponse.Code].
const (
	CodeAttestation         = "attestation_failed"
	CodeAttestationRequired = "attestation_required"
	// CodeAttestationUnavailable is ErrAttestationUnavailable's code.
	CodeAttestationUnavailable = "attestation_unavailable"
)

// MsgAttestationRequired is the message of a CodeAttestationRequired
// response.
const MsgAttestationRequired = "this gateway requires a MUNGE credential with every join (attested identity): run airlock run on a node whose munged shares its key with the gateway (AIRLOCK_MUNGE_SOCKET names its socket; docs/security.md)"
