// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"strconv"

	"github.com/airlock-vpn/airlock/internal/identity"
)

// Identity is a fact with a source: status and whois print every value of
// who a job is with where it comes from, "(munge)" for what a MUNGE
// credential attested, "(claimed)" for what the job's client said.

// sourced is v (escaped by the caller) with its source, or "-" for no
// value.
func sourced(v, source string) string {
	if v == "" {
		return "-"
	}
	return v + " (" + source + ")"
}

// jobCell is a batch job id with its source.
func jobCell(id string, a *identity.Attestation) string {
	if a != nil && a.Job != nil {
		return sourced(human(a.Job.JobID), a.By)
	}
	return sourced(human(id), identity.SourceClaimed)
}

// userCell is a job's user: the attested uid (and the gateway's name for
// it), else the claimed name and uid.
func userCell(user string, uid int, a *identity.Attestation) string {
	if a != nil {
		v := "uid " + strconv.FormatUint(uint64(a.UID), 10)
		if a.User != "" {
			v = human(a.User) + " " + v
		}
		return sourced(v, a.By)
	}
	if user == "" {
		return sourced("uid "+strconv.Itoa(uid), identity.SourceClaimed)
	}
	return sourced(human(user)+" uid "+strconv.Itoa(uid), identity.SourceClaimed)
}

// hostCell is a job's node: the attested node (its munged's address, and
// the batch system's name for it if root vouched for one), else the
// claimed host name.
func hostCell(host string, a *identity.Attestation) string {
	if a != nil && a.Node.IsValid() {
		v := a.Node.String()
		if a.Job != nil && a.Job.Node != "" {
			v = human(a.Job.Node) + " " + v
		}
		return sourced(v, a.By)
	}
	return sourced(human(host), identity.SourceClaimed)
}

// identityCell is a job's identity from its bearer token: "ISSUER/SUBJECT
// [GROUPS] (issuer-verified)", or "-" for a job without one.
func identityCell(i *identity.Issued) string {
	if i == nil {
		return "-"
	}
	v := human(i.Issuer) + "/" + human(i.Subject)
	if len(i.Groups) > 0 {
		g := ""
		for n, x := range i.Groups {
			if n > 0 {
				g += ","
			}
			g += human(x)
		}
		v += " [" + g + "]"
	}
	return sourced(v, identity.SourceIssuer)
}
