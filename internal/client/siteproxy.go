// SPDX-License-Identifier: MIT

package client

import (
	"log/slog"
	"net"
	"time"

	"github.com/airlock-vpn/airlock/internal/siteproxy"
)

// NewDialer returns how a job's airlock run reaches its gateways' control
// ports (requests and the TCP transport): directly, else through the
// site's web proxy that getenv's HTTPS_PROXY names (internal/siteproxy).
// The WireGuard UDP transport is never proxied.
func NewDialer(getenv func(string) string, log *slog.Logger) *siteproxy.Dialer {
	return siteproxy.NewDialer(siteproxy.FromEnv(getenv), &net.Dialer{Timeout: RequestTimeout, KeepAlive: 30 * time.Second}, 0, log)
}
