// SPDX-License-Identifier: MIT

// Package statefile writes and probes the small files of Airlock's state
// directories (the gateway's keys, certificate and join.env, a bearer
// issuer's cached key set, a job's egress note): writes that a crash leaves
// either old or new, never torn. It knows nothing of what the files hold,
// so the wire protocol, the configuration and the client use it without
// importing the gateway's storage (internal/store).
package statefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Exists reports whether a file exists at path, so that read-only callers
// can avoid creating one (the state database, the gateway's identity).
func Exists(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
}

// WriteAtomic writes data to a temporary file in path's directory with
// mode perm, syncs it and renames it to path, so a crash leaves either the
// old file or the new one, never a torn one. It is for the small files of
// the gateway's state directory: keys, certificate, join.env.
func WriteAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
