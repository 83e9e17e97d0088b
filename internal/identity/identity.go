// SPDX-License-Identifier: MIT

// Package identity says who a job is, and on whose word. A job's record
// (Job) keeps apart what its client claimed (Claimed: job id, user, uid,
// host), what it joined with (a token's name, an address) and what a
// party the gateway trusts attested (Attestation: a MUNGE credential made
// on the node, and root's credential for the batch job). Every value has
// its source, and records, logs and admin output say which.
//
// A new source of identity (a verified bearer token: issuer, subject,
// groups) is a field of Job of its own type beside Attested, with its own
// source word; nothing that reads Claimed changes.
package identity

import (
	"fmt"
	"net/netip"
	"time"
)

// Job is what the gateway knows of a job that holds a lease, and on whose
// word: the lease's owner. Its zero value is a job that claimed nothing
// and joined without a token.
type Job struct {
	// Claimed is what the job's client said about it.
	Claimed Claimed
	// Token is the name of the join token it joined with; "" for a join
	// with attested identity alone.
	Token string
	// Remote is the address the join came from.
	Remote netip.AddrPort
	// Attested is what a MUNGE credential attested; nil if nothing was.
	Attested *Attestation
	// Issued is what an issuer-verified bearer token says (issued.go);
	// nil if the job presented none.
	Issued *Issued
}

// AttestedUID returns j's attested uid, or nil.
func (j Job) AttestedUID() *uint32 {
	if j.Attested == nil {
		return nil
	}
	u := j.Attested.UID
	return &u
}

// Claimed is what a job's client said about the job: none of it is
// trusted for authorization. It has the fields of the control protocol's
// JobInfo, which converts to it.
type Claimed struct {
	// BatchJobID is the batch system's job id; BatchSystem names the
	// batch system ("slurm").
	BatchJobID  string
	BatchSystem string
	Hostname    string
	User        string
	UID         int
	// Command is the job's argv[0], for the admin's eyes only.
	Command string
}

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
