// SPDX-License-Identifier: MIT

package attest

import (
	"context"
	"fmt"
	"strings"

	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// JoinTTL is the lifetime of a join credential: it is made for one join,
// right before it.
const JoinTTL = 60

// MakeJoin has munged make the join credential of a join to the gateway
// pinned pin (or several pins separated by "|" or ",": a key rotation)
// with WireGuard key pub, binding the job credential jobCred ("" for
// none). The credential carries the caller's uid and gid.
func MakeJoin(ctx context.Context, c munge.Client, pin string, pub wgkey.Key, jobCred string) (string, error) {
	p := JoinPayload{Gateway: strings.ReplaceAll(pin, "|", ","), Key: pub}
	if jobCred != "" {
		p.JobCred = JobCredHash(jobCred)
	}
	cred, err := c.Encode(ctx, p.Marshal(), munge.EncodeOptions{TTL: JoinTTL})
	if err != nil {
		return "", fmt.Errorf("make the join's MUNGE credential: %w", err)
	}
	return cred, nil
}

// MakeJob has munged make a job credential for p (the SPANK plugin does
// the same in C, as root). ttl is in seconds (0: munged's default).
func MakeJob(ctx context.Context, c munge.Client, p JobPayload, ttl uint32) (string, error) {
	cred, err := c.Encode(ctx, p.Marshal(), munge.EncodeOptions{TTL: ttl})
	if err != nil {
		return "", fmt.Errorf("make the job's MUNGE credential: %w", err)
	}
	return cred, nil
}
