// SPDX-License-Identifier: MIT

package main

import (
	"net/netip"
	"testing"

	"github.com/airlock-vpn/airlock/internal/identity"
)

// TestIdentityCells: every identity value status and whois print says
// where it comes from.
func TestIdentityCells(t *testing.T) {
	att := &identity.Attestation{By: "munge", UID: 1000, User: "alice", Node: netip.MustParseAddr("10.1.2.3"),
		Job: &identity.AttestedJob{BatchSystem: "slurm", JobID: "4242", Node: "cn1"}}
	uidOnly := &identity.Attestation{By: "munge", UID: 1000, Node: netip.MustParseAddr("10.1.2.3")}
	for _, tc := range []struct{ got, want string }{
		{jobCell("4242", att), "4242 (munge)"},
		{jobCell("4242", uidOnly), "4242 (claimed)"},
		{jobCell("", nil), "-"},
		{userCell("mallory", 0, att), "alice uid 1000 (munge)"},
		{userCell("mallory", 0, nil), "mallory uid 0 (claimed)"},
		{hostCell("anywhere", att), "cn1 10.1.2.3 (munge)"},
		{hostCell("anywhere", uidOnly), "10.1.2.3 (munge)"},
		{hostCell("cn\x1b1", nil), `"cn\x1b1" (claimed)`},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}
