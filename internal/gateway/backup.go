// SPDX-License-Identifier: MIT

package gateway

import (
	"io"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
)

// BackupFiles are the state directory's files that a backup holds beside
// the database (admin.WriteBackup): the identities clients pin (and the
// next one during a key rotation), the WireGuard key and the IPv6 tunnel
// prefix. join.env, the admin socket and the flow log are left out:
// made at start, or shipped elsewhere.
func BackupFiles() []string {
	return []string{control.KeyFile, control.CertFile, control.NextKeyFile, control.NextCertFile, WireGuardKeyFile, Subnet6File}
}

// Backup implements admin.Backuper: the state directory, with a copy of
// the database taken while the gateway runs.
func (ag *adminGateway) Backup(w io.Writer) error {
	return admin.WriteBackup(w, ag.g.cfg.StateDir, BackupFiles(), ag.g.local)
}
