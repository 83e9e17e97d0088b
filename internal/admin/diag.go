// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"syscall"
)

// MetricsPath serves the gateway's Prometheus metrics on the admin socket
// (text exposition format), whether or not --metrics serves them on the
// network: airlock gateway diag gathers them there.
const MetricsPath = "/v1/metrics"

// maxDiagBody bounds one answer GetRaw copies (a CPU profile of a minute
// is a few MB).
const maxDiagBody = 256 << 20

// GetRaw copies the body of GET path (MetricsPath, a /debug/pprof/ one)
// into w, at most maxDiagBody bytes, and returns its size; a non-2xx
// answer is an error.
func (c *Client) GetRaw(ctx context.Context, path string, w io.Writer) (int64, error) {
	body, err := c.get(ctx, path)
	if err != nil {
		return 0, err
	}
	defer body.Close()
	return io.Copy(w, io.LimitReader(body, maxDiagBody))
}

// get sends GET path and returns the body of a 2xx answer, which the
// caller closes.
func (c *Client) get(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://airlock"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("admin socket %s: %w", c.path, ErrNoGateway)
		}
		return nil, fmt.Errorf("admin socket %s: %w", c.path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, responseError(http.MethodGet, path, resp)
	}
	return resp.Body, nil
}
