// SPDX-License-Identifier: MIT

package store

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"
)

// Attestation is what a trusted party vouched for about a lease's job, and
// by what means: every value in it is attested. A LeaseRecord's own
// fields (JobID, User, UID, Host) are what the job's client claimed; a
// record without an Attestation has claimed values only.
type Attestation struct {
	// By names the means: "munge" (a MUNGE credential the joining
	// process made on the node, decoded by the gateway's munged).
	By string `json:"by"`
	// UID and GID are the joining process's, as the node's munged saw
	// them.
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// User is the gateway host's name for UID ("" if it has none).
	User string `json:"user,omitempty"`
	// Node is the address the node's munged gives as its origin; invalid
	// if it gave none.
	Node netip.Addr `json:"node,omitzero"`
	// Made is when the credential was made, by the node's clock.
	Made time.Time `json:"made,omitzero"`
	// Job is set when root on the node (or another uid the gateway
	// trusts) vouched for the batch job too.
	Job *AttestedJob `json:"job,omitempty"`
}

// AttestedJob is a batch job as a credential made by a trusted uid (root
// in slurmstepd: Airlock's SPANK plugin) describes it.
type AttestedJob struct {
	// MadeBy is the uid that made the job credential (0: root).
	MadeBy      uint32 `json:"made_by"`
	BatchSystem string `json:"batch_system"`
	JobID       string `json:"job_id"`
	// Step is the job step ("0", "batch", ...), Node the batch
	// system's name for the node; either may be empty.
	Step string `json:"step,omitempty"`
	Node string `json:"node,omitempty"`
	// Inherited reports that this lease took the attestation over from
	// the lease it replaced (a rejoin with proof of that lease), rather
	// than from a job credential of its own.
	Inherited bool `json:"inherited,omitempty"`
}

// Source words for what admins read: "munge" for a value attested that
// way, "claimed" for one the client only claimed.
const (
	SourceClaimed = "claimed"
)

// UIDSource returns r's uid and where it comes from: the attestation's, or
// the claimed one.
func (r LeaseRecord) UIDSource() (uid int64, source string) {
	if r.Attested != nil {
		return int64(r.Attested.UID), r.Attested.By
	}
	return int64(r.UID), SourceClaimed
}

// JobSource returns r's batch job id and where it comes from.
func (r LeaseRecord) JobSource() (id, source string) {
	if r.Attested != nil && r.Attested.Job != nil {
		return r.Attested.Job.JobID, r.Attested.By + " (uid " + strconv.FormatUint(uint64(r.Attested.Job.MadeBy), 10) + ")"
	}
	return r.JobID, SourceClaimed
}

// String describes a for logs and admins: "munge: uid 1000 (alice) gid
// 1000 on 10.1.2.3, job slurm 4242 step 0 (made by uid 0)".
func (a *Attestation) String() string {
	if a == nil {
		return SourceClaimed
	}
	s := fmt.Sprintf("%s: uid %d", a.By, a.UID)
	if a.User != "" {
		s += " (" + a.User + ")"
	}
	s += fmt.Sprintf(" gid %d", a.GID)
	if a.Node.IsValid() {
		s += " on " + a.Node.String()
	}
	if j := a.Job; j != nil {
		s += ", job " + j.BatchSystem + " " + j.JobID
		if j.Step != "" {
			s += " step " + j.Step
		}
		s += fmt.Sprintf(" (made by uid %d", j.MadeBy)
		if j.Inherited {
			s += ", from the replaced lease"
		}
		s += ")"
	}
	return s
}
