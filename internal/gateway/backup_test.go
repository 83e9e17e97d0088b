// SPDX-License-Identifier: MIT

package gateway

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/store"
)

// TestBackupRestore backs up a running gateway through its admin socket,
// restores the archive into a new state directory and starts a gateway
// there: same pin, same tokens.
func TestBackupRestore(t *testing.T) {
	g := startGateway(t)
	tok := newToken(t, g)
	c, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var buf bytes.Buffer
	if _, err := c.Backup(context.Background(), &buf); err != nil {
		t.Fatal(err)
	}
	restored := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(restored, 0o700); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Mode != 0o600 || strings.Contains(h.Name, "/") {
			t.Errorf("entry %s mode %o, want a plain name with mode 0600", h.Name, h.Mode)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(restored, h.Name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	if got := strings.Join(names, " "); got != "airlock.db tls.crt tls.key wireguard.key" && got != "airlock.db subnet6 tls.crt tls.key wireguard.key" {
		t.Errorf("archive holds %s", got)
	}
	g.stop()

	st, err := store.Open(filepath.Join(restored, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.VerifyToken(tok, time.Now()); err != nil {
		t.Errorf("the token in the restored database: %v", err)
	}
	st.Close()
	r := startGatewayAt(t, restored)
	defer r.stop()
	if r.info.Fingerprint != g.info.Fingerprint {
		t.Errorf("restored gateway's pin %s, want %s", r.info.Fingerprint, g.info.Fingerprint)
	}
}
