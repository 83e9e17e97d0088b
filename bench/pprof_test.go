// SPDX-License-Identifier: MIT

package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// adminProfile fetches path (e.g. "/debug/pprof/profile?seconds=20" or
// "/debug/pprof/heap") from the gateway's admin socket in state and writes
// it to file. It bounds the request by timeout.
func adminProfile(state, path, file string, timeout time.Duration) error {
	sock := filepath.Join(state, "admin.sock")
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}, Timeout: timeout}
	resp, err := c.Get("http://admin" + path)
	if err != nil {
		return fmt.Errorf("profile %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 500))
		return fmt.Errorf("profile %s: %s: %s", path, resp.Status, b)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile %s: %w", path, err)
	}
	return f.Close()
}
