// SPDX-License-Identifier: MIT

package identity

import (
	"strconv"
	"strings"
	"time"
)

// SourceIssuer is the source word of an identity a token issuer vouched
// for: a bearer token (WLCG/SciTokens JWT) whose signature, issuer,
// audience, lifetime and scopes the gateway verified with the issuer's
// published keys.
const SourceIssuer = "issuer-verified"

// Issued is a job's identity as a token issuer the gateway trusts
// vouched for it (internal/bearer verified the token). Every value in it
// is the issuer's, none the client's.
type Issued struct {
	// Issuer is the token's "iss" (the issuer's URL), Subject its "sub".
	Issuer  string `json:"issuer"`
	Subject string `json:"subject"`
	// Groups are its "wlcg.groups".
	Groups []string `json:"groups,omitempty"`
	// As is the name the gateway accounts the job under in policy,
	// limits and quotas (the issuer's configured name, or a mapping of
	// its subject or group).
	As string `json:"as,omitempty"`
	// Expires is when the token last presented expires.
	Expires time.Time `json:"expires,omitzero"`
}

// ID is "issuer/subject": what attribution names.
func (i *Issued) ID() string {
	if i == nil {
		return ""
	}
	return i.Issuer + "/" + i.Subject
}

// String describes i for logs and admins: "issuer-verified:
// https://iss.example subject alice, groups /cms,/cms/production".
func (i *Issued) String() string {
	if i == nil {
		return SourceClaimed
	}
	s := SourceIssuer + ": " + i.Issuer + " subject " + strconv.Quote(i.Subject)
	if len(i.Groups) > 0 {
		s += ", groups " + strings.Join(i.Groups, ",")
	}
	return s
}

// ByBearer reports whether j joined with a bearer token alone: its Token
// is then its issuer's name (Issued.As), not a join token in the store.
func (j Job) ByBearer() bool { return j.Issued != nil && j.Issued.As != "" }

// Same reports whether i and o name the same issuer and subject.
func (i *Issued) Same(o *Issued) bool {
	return i != nil && o != nil && i.Issuer == o.Issuer && i.Subject == o.Subject
}
