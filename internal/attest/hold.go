// SPDX-License-Identifier: MIT

package attest

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/munge"
)

// Held job credentials: a job that has to wait must not fail (issue 33,
// item 1). Root makes a job's credential once (the SPANK plugin), and the
// gateway's munged decodes each credential once. A join refused for a
// reason that clears with time (its token's max_leases, a join rate, a
// drain, a busy gateway) has already had its job credential decoded; the
// job's retry carries the same job credential (with a fresh join
// credential), which munged would now refuse as replayed. So the gateway
// keeps the job credentials it decoded for joins that were not admitted,
// for JobHold, and a retry finds its job credential here instead of
// asking munged again: the same checks run on it as on a fresh one (the
// join credential that binds it, the node, the claimed job id). A join
// that is admitted, or refused for good, spends its job credential: it
// leaves the table, and munged's replay cache refuses it from then on.
//
// While one join uses a held credential, another join that presents it is
// refused as a replay: the held credential serves one join at a time,
// which is what munged's single decode gave before. A copy of a job
// credential is then worth what it was: to the job's own user on its
// node, one join as that job while the job has not joined (the job's own
// join then fails loudly).

// JobHold is how long the gateway keeps the job credential of a join it
// refused for a reason that clears with time: longer than a job waits for
// a gateway (airlock run --join-timeout, default 5 minutes), so that the
// job credential outlives the wait whatever its own lifetime.
const JobHold = time.Hour

// maxHeld bounds the table; the oldest entry goes first. Only job
// credentials a trusted uid (root) made enter it, one per job.
const maxHeld = 1 << 16

// Holds is the table of held job credentials. Share one between the
// Verifiers of one gateway (a reload makes a new Verifier). It is safe for
// concurrent use; the zero value is empty and ready.
type Holds struct {
	mu    sync.Mutex
	creds map[[32]byte]*held // guarded by mu
	now   func() time.Time   // nil: time.Now (tests set it)
}

// held is one decoded job credential.
type held struct {
	cred  munge.Credential
	until time.Time
	inUse bool // a join is being admitted with it
}

func holdKey(cred string) [32]byte { return sha256.Sum256([]byte(cred)) }

func (h *Holds) clock() time.Time {
	if h.now != nil {
		return h.now()
	}
	return time.Now()
}

// take returns the held credential cred for a join, and marks it in use;
// busy reports that another join uses it now.
func (h *Holds) take(cred string) (c munge.Credential, ok, busy bool) {
	if h == nil {
		return munge.Credential{}, false, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.creds[holdKey(cred)]
	switch {
	case e == nil:
		return munge.Credential{}, false, false
	case h.clock().After(e.until):
		delete(h.creds, holdKey(cred))
		return munge.Credential{}, false, false
	case e.inUse:
		return munge.Credential{}, false, true
	}
	e.inUse = true
	return e.cred, true, false
}

// put holds cred, just decoded as c, in use by the join that decoded it.
func (h *Holds) put(cred string, c munge.Credential) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock()
	if h.creds == nil {
		h.creds = map[[32]byte]*held{}
	}
	if len(h.creds) >= maxHeld {
		var oldest [32]byte
		var at time.Time
		for k, e := range h.creds {
			if now.After(e.until) {
				delete(h.creds, k)
				continue
			}
			if at.IsZero() || e.until.Before(at) {
				oldest, at = k, e.until
			}
		}
		if len(h.creds) >= maxHeld {
			delete(h.creds, oldest)
		}
	}
	h.creds[holdKey(cred)] = &held{cred: c, until: now.Add(JobHold), inUse: true}
}

// settle ends the use of the held credential cred: kept for a retry
// (keep), or spent.
func (h *Holds) settle(cred string, keep bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := holdKey(cred)
	e := h.creds[k]
	switch {
	case e == nil:
	case keep:
		e.inUse = false
	default:
		delete(h.creds, k)
	}
}

// Len returns how many job credentials are held (metrics, tests).
func (h *Holds) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.creds)
}
