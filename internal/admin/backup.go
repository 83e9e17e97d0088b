// SPDX-License-Identifier: MIT

package admin

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/airlock-vpn/airlock/internal/httpjson"
	"github.com/airlock-vpn/airlock/internal/store"
)

// BackupPath is the admin endpoint of airlock gateway backup: GET returns
// the state directory as a gzipped tar stream.
const BackupPath = "/v1/backup"

// Backuper is the part of a running gateway that backs up its state
// directory; SetBackuper registers it.
type Backuper interface {
	// Backup writes the state directory to w as WriteBackup does.
	Backup(w io.Writer) error
}

// SetBackuper registers GET /v1/backup, answered by b.
func (s *Server) SetBackuper(b Backuper) {
	s.mux.HandleFunc("GET "+BackupPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/gzip")
		if err := b.Backup(w); err != nil {
			// Before the first byte this is a 500; after it, the
			// client sees a truncated gzip stream and fails.
			s.log.Error("backup failed", "err", err)
			httpjson.Write(w, http.StatusInternalServerError, errorBody{Code: codeInternal, Message: err.Error()})
			return
		}
		s.log.Info("state directory backed up")
	})
}

// WriteBackup writes a gzipped tar of the state directory dir to w: the
// files named (those that exist; keys, certificates, the IPv6 prefix) and
// a consistent copy of db as store.FileName, taken while db stays in use.
// Entries are plain names with mode 0600, to be unpacked into an empty
// state directory (docs/operations.md). Nothing is written if the
// database copy fails.
func WriteBackup(w io.Writer, dir string, files []string, db *store.Store) error {
	snap, err := os.CreateTemp("", "airlock-backup-*.db")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer os.Remove(snap.Name())
	defer snap.Close()
	if err := os.Chmod(snap.Name(), 0o600); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	size, err := db.WriteTo(snap)
	if err != nil {
		return err
	}
	if _, err := snap.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	now := time.Now()
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	add := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: now, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if err := add(name, int64(len(b)), bytes.NewReader(b)); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	}
	if err := add(store.FileName, size, snap); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return zw.Close()
}

// Backup streams the running gateway's backup into w and returns its
// size.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	body, err := c.get(ctx, BackupPath)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	return io.Copy(w, body)
}
