// SPDX-License-Identifier: MIT

package store

import (
	"strconv"

	"github.com/airlock-vpn/airlock/internal/identity"
)

// UIDSource returns r's uid and where it comes from: the attestation's, or
// the claimed one.
func (r LeaseRecord) UIDSource() (uid int64, source string) {
	if r.Attested != nil {
		return int64(r.Attested.UID), r.Attested.By
	}
	return int64(r.UID), identity.SourceClaimed
}

// JobSource returns r's batch job id and where it comes from.
func (r LeaseRecord) JobSource() (id, source string) {
	if r.Attested != nil && r.Attested.Job != nil {
		return r.Attested.Job.JobID, r.Attested.By + " (uid " + strconv.FormatUint(uint64(r.Attested.Job.MadeBy), 10) + ")"
	}
	return r.JobID, identity.SourceClaimed
}
