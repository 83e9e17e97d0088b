// SPDX-License-Identifier: MIT

package pgstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Job credentials claimed across the fleet (migrations/004): a job
// credential admits one job in the whole fleet.

// JobCredentialKeep is how long a claim is kept: longer than any job
// credential lives (the SPANK plugin's default is 300 s; munged caps it).
const JobCredentialKeep = 24 * time.Hour

// ClaimJobCredential claims the job credential whose SHA-256 is hash for
// member gw and its lease, and returns the member and lease that hold it:
// gw's own (a claim made now, or an earlier one of gw's: a retry of the
// same join there), or another member's, which the caller refuses.
func (s *Store) ClaimJobCredential(hash []byte, gw, lease string) (holder, holderLease string, err error) {
	ctx, cancel := s.call()
	defer cancel()
	err = s.pool.QueryRow(ctx, `with ins as (
			insert into airlock_job_credentials (hash, gateway, lease_id, expires)
			values ($1, $2, $3, now() + $4 * interval '1 second') on conflict (hash) do nothing
			returning gateway, lease_id)
		select gateway, lease_id from ins
		union all
		select gateway, lease_id from airlock_job_credentials where hash = $1 and not exists (select from ins)`,
		hash, gw, lease, int64(JobCredentialKeep/time.Second)).Scan(&holder, &holderLease)
	if errors.Is(err, pgx.ErrNoRows) {
		// Claimed at the same moment by another statement, which our
		// snapshot did not see: it is committed now.
		err = s.pool.QueryRow(ctx, "select gateway, lease_id from airlock_job_credentials where hash = $1", hash).Scan(&holder, &holderLease)
	}
	if err != nil {
		return "", "", fmt.Errorf("claim job credential: %w", denied(err, "claim a job credential for another gateway"))
	}
	// Claims past their day go, a few at a time.
	s.pool.Exec(ctx, `delete from airlock_job_credentials where hash in (select hash from airlock_job_credentials where expires < now() limit 100)`)
	return holder, holderLease, nil
}
